/* Runs one inference of a .svod code image the way svodrt does, on any Linux architecture (built
 * static by a Debian cross gcc, run under qemu-user by tests/cross/emulate.py).
 *
 * The Python side parses the bundle with svodrt's own parser and picks the variant with svodrt's
 * own selection; this program gets the bundle file and the numbers from the manifest, and then
 * does what svodrt/memory.py and svodrt/model.py do:
 *   - copy the code section into fresh anonymous read+write memory (its sha256 was checked by the
 *     Python side, as svodrt checks it), add the load address to every fixup word (host byte order =
 *     the bundle's; each must hold an offset inside the image), mprotect it read+execute (W^X), and
 *     on riscv64 ask the kernel to make instruction caches coherent (riscv_flush_icache);
 *   - map the weights section read-only from the file (copy it when it is small and unaligned);
 *   - build the buffer table [arena, weights, inputs..., outputs...] and the zeroed 64-byte sync
 *     block with sched_yield at offset 8;
 *   - call svod_entry(bufs, NULL, thread, nthreads, sync) from nthreads threads at once.
 *
 * Job file (text, whitespace separated):
 *   bundle_path code_offset code_length entry_offset weights_offset weights_length arena_size nthreads
 *   nfixups fixup_offset...
 *   ninputs (path nbytes)...   noutputs (path nbytes)...
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef void (*entry_fn)(void **, const int64_t *, int32_t, int32_t, void *);

struct call { entry_fn entry; void **bufs; int32_t thread, nthreads; void *sync; };

static void die(const char *what) { perror(what); exit(2); }

static void *aligned(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64)) die("posix_memalign");
    memset(p, 0, n ? n : 64);
    return p;
}

static void *run_thread(void *arg) {
    struct call *c = arg;
    c->entry(c->bufs, NULL, c->thread, c->nthreads, c->sync);
    return NULL;
}

static void read_file(const char *path, void *dst, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f || fread(dst, 1, n, f) != n) die(path);
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s JOBFILE\n", argv[0]); return 2; }
    FILE *job = fopen(argv[1], "r");
    if (!job) die(argv[1]);
    char bundle[4096];
    unsigned long long code_off, code_len, entry_off, w_off, w_len, arena_size, nthreads, nfix;
    if (fscanf(job, "%4095s %llu %llu %llu %llu %llu %llu %llu %llu", bundle, &code_off, &code_len, &entry_off,
               &w_off, &w_len, &arena_size, &nthreads, &nfix) != 9) die("job header");
    int fd = open(bundle, O_RDONLY);
    if (fd < 0) die(bundle);

    long page = sysconf(_SC_PAGESIZE);
    size_t code_map = (code_len + page - 1) / page * page;
    uint8_t *code = mmap(NULL, code_map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED) die("mmap code");
    if (pread(fd, code, code_len, (off_t)code_off) != (ssize_t)code_len) die("read code");
    for (unsigned long long i = 0; i < nfix; i++) {
        unsigned long long off;
        if (fscanf(job, "%llu", &off) != 1 || off + 8 > code_len) die("fixup");
        uint64_t word;
        memcpy(&word, code + off, 8);
        if (word > code_len) die("fixup word is not an offset inside the image");
        word += (uint64_t)(uintptr_t)code;
        memcpy(code + off, &word, 8);
    }
    if (mprotect(code, code_map, PROT_READ | PROT_EXEC)) die("mprotect");
#if defined(__riscv)
    syscall(259 /* __NR_riscv_flush_icache */, code, code + code_map, 0UL);
#endif

    /* weights: mapped read-only from the file when the section is page-aligned (svodrt maps large
     * sections, which are 64 KiB-aligned), else copied into aligned memory (small sections) */
    void *weights = aligned(w_len);
    if (w_len && w_off % (unsigned long long)page == 0) {
        free(weights);
        weights = mmap(NULL, w_len, PROT_READ, MAP_PRIVATE, fd, (off_t)w_off);
        if (weights == MAP_FAILED) die("mmap weights");
    } else if (w_len && pread(fd, weights, w_len, (off_t)w_off) != (ssize_t)w_len) {
        die("read weights");
    }
    unsigned long long nin, nout;
    char paths[64][4096];
    unsigned long long sizes[64];
    if (fscanf(job, "%llu", &nin) != 1 || nin > 32) die("inputs");
    void *bufs[2 + 64];
    bufs[0] = aligned(arena_size);
    bufs[1] = weights;
    for (unsigned long long i = 0; i < nin; i++) {
        if (fscanf(job, "%4095s %llu", paths[i], &sizes[i]) != 2) die("input");
        bufs[2 + i] = aligned(sizes[i]);
        read_file(paths[i], bufs[2 + i], sizes[i]);
    }
    if (fscanf(job, "%llu", &nout) != 1 || nout > 32) die("outputs");
    for (unsigned long long i = 0; i < nout; i++) {
        if (fscanf(job, "%4095s %llu", paths[nin + i], &sizes[nin + i]) != 2) die("output");
        bufs[2 + nin + i] = aligned(sizes[nin + i]);
    }

    uint64_t sync[8] = {0};
    void (*yield)(void) = (void (*)(void))sched_yield;
    memcpy(&sync[1], &yield, sizeof yield);
    entry_fn entry = (entry_fn)(void *)(code + entry_off);
    if (nthreads < 1 || nthreads > 64) die("nthreads");
    struct call calls[64];
    pthread_t tids[64];
    for (unsigned long long t = 0; t < nthreads; t++) {
        calls[t] = (struct call){entry, bufs, (int32_t)t, (int32_t)nthreads, sync};
        if (t && pthread_create(&tids[t], NULL, run_thread, &calls[t])) die("pthread_create");
    }
    run_thread(&calls[0]);
    for (unsigned long long t = 1; t < nthreads; t++) pthread_join(tids[t], NULL);

    for (unsigned long long i = 0; i < nout; i++) {
        FILE *f = fopen(paths[nin + i], "wb");
        if (!f || fwrite(bufs[2 + nin + i], 1, sizes[nin + i], f) != sizes[nin + i]) die(paths[nin + i]);
        fclose(f);
    }
    return 0;
}
