/* A stand-in GPU driver for tests: the CUDA driver API and HIP module API functions svodrt calls,
 * implemented on host memory ("device" pointers are malloc'ed host addresses).
 *
 * - Module loads accept what a real driver would be given: CUDA a cubin (ELF, e_machine 190) or PTX
 *   text for an architecture the device has (SVOD_STUB_CC, default 90); HIP a shared object for the
 *   AMDGPU machine in SVOD_STUB_MACH (default 0x4c, gfx942), else hipErrorNoBinaryForGpu.
 * - Kernel launches call the launcher the test registers (svod_stub_set_launcher), which runs the
 *   CPU emulation of that kernel on the argument array; stream capture records launches and a graph
 *   launch replays them, like a real graph.
 * - SVOD_STUB_DEVICES sets the device count (default 1); SVOD_STUB_FAIL=<function name> makes that
 *   function fail with the "unknown error" code (999 in both APIs).
 * - Every call is appended to a log (svod_stub_log) that tests read.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*launcher_t)(const char *symbol, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                           unsigned bz, void **params);
static launcher_t launcher;
static char log_buf[1 << 20];
static size_t log_len;

typedef struct { uint64_t p; size_t n; } alloc_t;
static alloc_t allocs[4096];
static int nallocs;

typedef struct { char name[64]; } func_t;
typedef struct { void *f; unsigned g[3], b[3]; void **params; } launch_t;
typedef struct { launch_t launches[8192]; int n; } graph_t;
static graph_t *capturing;

void svod_stub_set_launcher(launcher_t f) { launcher = f; }
const char *svod_stub_log(void) { return log_buf; }
void svod_stub_clear_log(void) { log_len = 0; log_buf[0] = 0; }
int svod_stub_live_allocations(void) { return nallocs; }

/* the i-th live allocation (0 <= i < svod_stub_live_allocations()): what an emulated GPU may address */
void svod_stub_allocation(int i, uint64_t *p, size_t *n) { *p = allocs[i].p; *n = allocs[i].n; }

/* 1 when [p, p + n) lies inside one live allocation */
int svod_stub_owns(uint64_t p, size_t n) {
  for (int i = 0; i < nallocs; i++)
    if (p >= allocs[i].p && p + n <= allocs[i].p + allocs[i].n) return 1;
  return 0;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#include <stdarg.h>
static void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (log_len + 256 < sizeof log_buf) {
    log_len += vsnprintf(log_buf + log_len, sizeof log_buf - log_len, fmt, ap);
    log_buf[log_len++] = '\n';
    log_buf[log_len] = 0;
  }
  va_end(ap);
}

static int env_int(const char *name, int dflt) {
  const char *v = getenv(name);
  return v ? (int)strtol(v, NULL, 0) : dflt;
}

static int failing(const char *fn) {
  const char *f = getenv("SVOD_STUB_FAIL");
  if (f && strcmp(f, fn) == 0) { say("%s -> fail", fn); return 1; }
  return 0;
}
#define FAIL_IF(fn) do { if (failing(fn)) return 999; } while (0)

static int do_alloc(uint64_t *p, size_t n) {
  if (n == 0) return 1; /* both drivers refuse a zero-byte allocation */
  void *m = aligned_alloc(256, (n + 255) / 256 * 256);
  memset(m, 0xA5, n); /* not zero: code must not rely on fresh memory being zero */
  allocs[nallocs].p = (uint64_t)m;
  allocs[nallocs++].n = n;
  *p = (uint64_t)m;
  say("alloc %zu", n);
  return 0;
}

static int do_free(uint64_t p) {
  for (int i = 0; i < nallocs; i++)
    if (allocs[i].p == p) {
      free((void *)p);
      allocs[i] = allocs[--nallocs];
      say("free");
      return 0;
    }
  return 1;
}

static int copy(void *dst, const void *src, size_t n, uint64_t dev, const char *what) {
  if (!svod_stub_owns(dev, n)) { say("%s outside device memory", what); return 1; }
  memcpy(dst, src, n);
  say("%s %zu", what, n);
  return 0;
}

static void run(launch_t *l) {
  func_t *f = l->f;
  say("launch %s grid %u %u %u block %u %u %u", f->name, l->g[0], l->g[1], l->g[2], l->b[0], l->b[1], l->b[2]);
  if (launcher) launcher(f->name, l->g[0], l->g[1], l->g[2], l->b[0], l->b[1], l->b[2], l->params);
}

static int launch(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                  void **params) {
  launch_t l = {f, {gx, gy, gz}, {bx, by, bz}, params};
  if (capturing) {
    capturing->launches[capturing->n++] = l;
    say("captured %s", ((func_t *)f)->name);
  } else {
    run(&l);
  }
  return 0;
}

static int get_function(void **f, const char *name) {
  func_t *fn = calloc(1, sizeof *fn); /* leaked on purpose: a test process loads few modules */
  snprintf(fn->name, sizeof fn->name, "%s", name);
  *f = fn;
  return 0;
}

static int graph_launch(void *e) {
  graph_t *g = e;
  say("graph launch %d", g->n);
  for (int i = 0; i < g->n; i++) run(&g->launches[i]);
  return 0;
}

/* ---------------------------------------------------------------- CUDA driver API */
int cuInit(unsigned flags) { FAIL_IF("cuInit"); say("cuInit %u", flags); return 0; }
int cuDeviceGetCount(int *n) { FAIL_IF("cuDeviceGetCount"); *n = env_int("SVOD_STUB_DEVICES", 1); return 0; }
int cuDeviceGet(int *d, int ordinal) { *d = ordinal; return 0; }
int cuDeviceGetName(char *buf, int len, int d) { snprintf(buf, len, "stub device %d", d); return 0; }
int cuDeviceGetAttribute(int *v, int attr, int d) {
  int cc = env_int("SVOD_STUB_CC", 90);
  *v = attr == 75 ? cc / 10 : attr == 76 ? cc % 10 : 0;
  return 0;
}
int cuDevicePrimaryCtxRetain(void **ctx, int d) { say("retain context %d", d); *ctx = (void *)0x100; return 0; }
int cuDevicePrimaryCtxRelease_v2(int d) { say("release context %d", d); return 0; }
int cuCtxSetCurrent(void *ctx) { return ctx == (void *)0x100 ? 0 : 201; }
int cuGetErrorName(int e, const char **s) {
  *s = e == 200 ? "CUDA_ERROR_INVALID_IMAGE" : e == 218 ? "CUDA_ERROR_INVALID_PTX" : "CUDA_ERROR_UNKNOWN";
  return 0;
}
int cuMemAlloc_v2(uint64_t *p, size_t n) { FAIL_IF("cuMemAlloc_v2"); return do_alloc(p, n); }
int cuMemFree_v2(uint64_t p) { return do_free(p); }
int cuMemcpyHtoDAsync_v2(uint64_t dst, const void *src, size_t n, void *s) {
  return copy((void *)dst, src, n, dst, "htod");
}
int cuMemcpyDtoHAsync_v2(void *dst, uint64_t src, size_t n, void *s) {
  return copy(dst, (void *)src, n, src, "dtoh");
}
int cuModuleLoadData(void **m, const char *image) {
  FAIL_IF("cuModuleLoadData");
  if (memcmp(image, "\x7f" "ELF", 4) == 0) {
    if (*(const uint16_t *)(image + 18) != 190) return 200;
    say("load cubin");
  } else {
    const char *t = strstr(image, ".target sm_");
    if (!t) return 218;
    if (atoi(t + 11) > env_int("SVOD_STUB_CC", 90)) return 218;
    say("load ptx sm_%d", atoi(t + 11));
  }
  *m = malloc(1);
  return 0;
}
int cuModuleUnload(void *m) { free(m); say("unload"); return 0; }
int cuModuleGetFunction(void **f, void *m, const char *name) { FAIL_IF("cuModuleGetFunction"); return get_function(f, name); }
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *stream, void **params, void **extra) {
  FAIL_IF("cuLaunchKernel");
  return launch(f, gx, gy, gz, bx, by, bz, params);
}
int cuStreamCreate(void **s, unsigned flags) { *s = (void *)0x200; return 0; }
int cuStreamSynchronize(void *s) { say("sync"); return 0; }
int cuStreamDestroy_v2(void *s) { say("stream destroy"); return 0; }
int cuStreamBeginCapture_v2(void *s, int mode) {
  FAIL_IF("cuStreamBeginCapture_v2");
  capturing = calloc(1, sizeof *capturing);
  say("begin capture %d", mode);
  return 0;
}
int cuStreamEndCapture(void *s, void **g) { *g = capturing; capturing = NULL; say("end capture"); return 0; }
int cuGraphInstantiateWithFlags(void **e, void *g, unsigned long long flags) { *e = g; return 0; }
int cuGraphLaunch(void *e, void *s) { return graph_launch(e); }
int cuGraphDestroy(void *g) { free(g); say("graph destroy"); return 0; }
int cuGraphExecDestroy(void *e) { return 0; }

/* ---------------------------------------------------------------- HIP module API */
int hipInit(unsigned flags) { FAIL_IF("hipInit"); say("hipInit %u", flags); return 0; }
int hipGetDeviceCount(int *n) { FAIL_IF("hipGetDeviceCount"); *n = env_int("SVOD_STUB_DEVICES", 1); return 0; }
int hipSetDevice(int d) { return d < env_int("SVOD_STUB_DEVICES", 1) ? 0 : 101; }
int hipDeviceGetName(char *buf, int len, int d) { return cuDeviceGetName(buf, len, d); }
const char *hipGetErrorName(int e) {
  return e == 209 ? "hipErrorNoBinaryForGpu" : e == 200 ? "hipErrorInvalidImage" : "hipErrorUnknown";
}
int hipMalloc(uint64_t *p, size_t n) { FAIL_IF("hipMalloc"); return do_alloc(p, n); }
int hipFree(uint64_t p) { return do_free(p); }
int hipMemcpyHtoDAsync(uint64_t dst, const void *src, size_t n, void *s) { return cuMemcpyHtoDAsync_v2(dst, src, n, s); }
int hipMemcpyDtoHAsync(void *dst, uint64_t src, size_t n, void *s) { return cuMemcpyDtoHAsync_v2(dst, src, n, s); }
int hipModuleLoadData(void **m, const char *image) {
  FAIL_IF("hipModuleLoadData");
  if (memcmp(image, "\x7f" "ELF", 4) != 0 || *(const uint16_t *)(image + 18) != 224 ||
      *(const uint16_t *)(image + 16) != 3)
    return 200;
  unsigned mach = *(const uint32_t *)(image + 48) & 0xff;
  if (mach != (unsigned)env_int("SVOD_STUB_MACH", 0x4c)) return 209;
  say("load code object mach 0x%x", mach);
  *m = malloc(1);
  return 0;
}
int hipModuleUnload(void *m) { return cuModuleUnload(m); }
int hipModuleGetFunction(void **f, void *m, const char *name) { return get_function(f, name); }
int hipModuleLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          unsigned shared, void *stream, void **params, void **extra) {
  FAIL_IF("hipModuleLaunchKernel");
  return launch(f, gx, gy, gz, bx, by, bz, params);
}
int hipStreamCreateWithFlags(void **s, unsigned flags) { return cuStreamCreate(s, flags); }
int hipStreamSynchronize(void *s) { return cuStreamSynchronize(s); }
int hipStreamDestroy(void *s) { return cuStreamDestroy_v2(s); }
int hipStreamBeginCapture(void *s, int mode) { return cuStreamBeginCapture_v2(s, mode); }
int hipStreamEndCapture(void *s, void **g) { return cuStreamEndCapture(s, g); }
int hipGraphInstantiateWithFlags(void **e, void *g, unsigned long long flags) { *e = g; return 0; }
int hipGraphLaunch(void *e, void *s) { return graph_launch(e); }
int hipGraphDestroy(void *g) { return cuGraphDestroy(g); }
int hipGraphExecDestroy(void *e) { return 0; }
