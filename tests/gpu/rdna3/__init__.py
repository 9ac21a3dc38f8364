"""An instruction-level RDNA3 (gfx1100) emulator for tests: Svod's AMD code objects executed on their
own ISA without a GPU (docs/architecture.md, "GPU targets").

decode.py   machine code -> instructions (encodings and the opcodes our kernels contain)
wave.py     lockstep batches of wave32 waves (SGPR/VGPR/EXEC/VCC/SCC), flat memory regions
salu.py     SOP*, SOPP, SMEM        valu.py  VOP1/2/C/3/3SD, VOPD        wmma.py  VOP3P WMMA
vmem.py     GLOBAL, DS, MUBUF       runner.py  code object, kernel descriptor, dispatch, scheduling
on_stub.py  svodrt's HIP path on the stand-in driver, its launches run here
objdump.py  the decoder cross-checked against llvm-objdump (a test oracle, optional)
"""
