/*
 * A fake CUDA driver (libcuda.so.1) over host memory, for running numba-cuda,
 * cuda-bindings and numba_bfc's CUDA backends on a machine with no GPU.
 *
 * It implements the driver functions that device memory needs: contexts,
 * cuMemAlloc/cuMemFree, copies and memsets, streams and events, IPC between
 * processes, and the virtual memory management API (cuMemAddressReserve,
 * cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease). It cannot
 * load or launch kernels.
 *
 * "Device memory" is one memfd file, shared-mapped, so that
 * - cuMemAlloc memory is real, readable and writable through copies;
 * - cuMemCreate handles are ranges of the file and cuMemMap maps them at the
 *   address asked for (MAP_FIXED), with no access until cuMemSetAccess, so a
 *   page unmapped from the middle of a region and mapped elsewhere keeps
 *   exactly the semantics of CUDA's physical memory handles;
 * - an IPC handle names the file and an offset, and another process opens it
 *   through /proc/<pid>/fd.
 * Copies and memsets check that every byte they touch is device memory that
 * is allocated (or mapped with access), host memory from cuMemHostAlloc, or
 * (for the host side) anything; a stray address returns CUDA_ERROR_INVALID_VALUE
 * instead of corrupting memory. Frees check that the pointer was allocated,
 * unmaps that whole mappings are named, releases of the address range that
 * nothing is mapped in it.
 *
 * Work is asynchronous, with CUDA's stream ordering, and as late as it may be,
 * so that code that reuses memory before the work touching it is ordered
 * before the reuse sees the damage a GPU would do. Every copy, memset and
 * event record is an op in one queue, with the ids of the ops it must follow;
 * nothing runs until something forces it, and running an op runs what it
 * follows first. An op follows the last op of its stream; on the legacy
 * default stream (handle 0 or CU_STREAM_LEGACY) also the last op of every
 * blocking stream, and on a blocking stream the last op of the legacy stream
 * ("the legacy stream first waits on all blocking streams, the action is
 * queued in the legacy stream, and then all blocking streams wait on the
 * legacy stream"); non-blocking streams only follow themselves. The
 * per-thread default stream (CU_STREAM_PER_THREAD, or 0 in the _ptsz/_ptds
 * variants that cuGetProcAddress hands out with
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) is a blocking stream of the
 * calling thread. What forces work, as on the real driver:
 * - synchronous copies run on the default stream and return done, but
 *   synchronous memsets of device memory are queued there like async ones; an
 *   async device-to-host copy into pageable memory returns done; an async
 *   host-to-device copy from pageable memory copies the source into a staging
 *   buffer at once (pinned sources are read when the copy runs);
 * - cuStreamSynchronize, cuEventSynchronize, cuEventElapsedTime, cuStreamDestroy
 *   run what they wait for; cuCtxSynchronize, cuMemFree, cuMemFreeHost and
 *   cuMemHostUnregister run everything; cuMemUnmap runs nothing;
 * - cuEventQuery and cuStreamQuery answer CUDA_ERROR_NOT_READY a set number of
 *   times for work recorded (NUMBA_BFC_FAKE_CUDA_EVENT_DELAY, or
 *   numba_bfc_fake_set_event_delay), then run it and answer CUDA_SUCCESS.
 * An op whose memory is no longer device memory when it runs (unmapped in
 * between) is skipped and counted as an illegal access, and the call that ran
 * it returns CUDA_ERROR_ILLEGAL_ADDRESS (not sticky, unlike a real device).
 * numba_bfc_fake_counters reports the queue's and events' counters to tests.
 *
 * Environment: NUMBA_BFC_FAKE_CUDA_MEMORY, the device's memory in bytes
 * (default 4 GiB; untouched memory costs nothing); NUMBA_BFC_FAKE_CUDA_EVENT_DELAY,
 * the NOT_READY answers each recorded event or stream gives (default 0).
 *
 * Functions are found the way cuda-bindings looks for them, through
 * cuGetProcAddress_v2, and by name (dlsym), the way numba-cuda's ctypes
 * loader does.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef unsigned long long cuuint64_t;
typedef struct fake_context *CUcontext;
typedef struct fake_stream *CUstream;
typedef struct fake_event *CUevent;
typedef struct { char bytes[16]; } CUuuid;
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_ALREADY_MAPPED = 208,
    CUDA_ERROR_NOT_MAPPED = 211,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    CUDA_ERROR_NOT_SUPPORTED = 801,
};

#define GRANULE (2ull << 20)     /* cuMemGetAllocationGranularity, both kinds */
#define PAGE 4096ull
#define DRIVER_VERSION 13000     /* CUDA 13.0 */

/* ------------------------------------------------------------------ state */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static int mem_fd = -1;
static unsigned long long total_memory, used_memory, file_size;
static char *heap;               /* the whole file, shared-mapped: cuMemAlloc memory */

/* Intervals of the device file in use: cuMemAlloc blocks and cuMemCreate handles. */
typedef struct {
    unsigned long long off, size;
    int kind;                    /* 1: cuMemAlloc, 2: cuMemCreate handle */
    int released;                /* handles: cuMemRelease called */
    int maps;                    /* handles: live mappings */
} block_t;
static block_t *blocks;
static size_t nblocks, cap_blocks;

typedef struct { unsigned long long start, size; } range_t;
static range_t *reservations, *host_ranges, *ipc_ranges;
static size_t nres, cap_res, nhost, cap_host, nipc, cap_ipc;

typedef struct {
    unsigned long long start, size, handle_off;
    int access;                  /* CU_MEM_ACCESS_FLAGS_PROT_*: 0 none, 1 read, 3 read-write */
} mapping_t;
static mapping_t *mappings;
static size_t nmaps, cap_maps;

struct fake_context { int retained; int alive; };
static struct fake_context primary = {0, 0};
static __thread CUcontext ctx_stack[64];
static __thread int ctx_depth;
#define CU_STREAM_NON_BLOCKING 1
#define STREAM_LEGACY ((CUstream)0x1)      /* CU_STREAM_LEGACY */
#define STREAM_PER_THREAD ((CUstream)0x2)  /* CU_STREAM_PER_THREAD */
struct fake_stream {
    int flags;                   /* CU_STREAM_NON_BLOCKING or 0 */
    unsigned long long last;     /* id of the last op queued on it; 0: none yet */
    int not_ready;               /* NOT_READY answers cuStreamQuery still gives */
    struct fake_stream *next;    /* the list of streams other than the legacy one */
};
struct fake_event {
    double when;                 /* taken when its marker runs */
    int recorded;
    unsigned long long marker;   /* the op cuEventRecord queued */
    int not_ready;               /* NOT_READY answers cuEventQuery still gives */
};

static void *grow(void *arr, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return arr;
    size_t n = *cap ? *cap * 2 : 64;
    while (n < need) n *= 2;
    void *p = realloc(arr, n * elem);
    if (!p) abort();
    *cap = n;
    return p;
}

static CUresult ensure_init(void) { return initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED; }

static CUresult need_context(void) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx_depth == 0 || ctx_stack[ctx_depth - 1] == NULL) return CUDA_ERROR_INVALID_CONTEXT;
    /* A primary context released to no retains, or reset, stays on the threads'
       stacks but is destroyed until retained again, under the same handle: an
       H100 (driver 580) answered CONTEXT_IS_DESTROYED after numba-cuda's
       cuda.close() when cuda.core set its cached handle current again. */
    if (ctx_stack[ctx_depth - 1] == (CUcontext)&primary && !primary.alive)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    return CUDA_SUCCESS;
}

static unsigned long long align_up(unsigned long long x, unsigned long long a) {
    return (x + a - 1) / a * a;
}

/* First fit over the sorted block list; returns the file offset or ~0. */
static unsigned long long take_file_range(unsigned long long size, unsigned long long align,
                                          int kind) {
    if (used_memory + size > total_memory) return ~0ull;
    unsigned long long pos = 0;
    size_t i = 0;
    for (; i <= nblocks; i++) {
        unsigned long long cand = align_up(pos, align);
        unsigned long long limit = i < nblocks ? blocks[i].off : file_size;
        if (cand + size <= limit) { pos = cand; break; }
        if (i < nblocks) pos = blocks[i].off + blocks[i].size;
    }
    if (i > nblocks) return ~0ull;
    blocks = grow(blocks, &cap_blocks, nblocks + 1, sizeof *blocks);
    memmove(blocks + i + 1, blocks + i, (nblocks - i) * sizeof *blocks);
    blocks[i] = (block_t){pos, size, kind, 0, 0};
    nblocks++;
    used_memory += size;
    return pos;
}

static void drop_block(size_t i) {
    block_t b = blocks[i];
    used_memory -= b.size;
    /* Give the pages back (partial pages are zeroed, their neighbours kept). */
    fallocate(mem_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)b.off, (off_t)b.size);
    memmove(blocks + i, blocks + i + 1, (nblocks - i - 1) * sizeof *blocks);
    nblocks--;
}

static long find_block(unsigned long long off, int kind) {
    for (size_t i = 0; i < nblocks; i++)
        if (blocks[i].off == off && blocks[i].kind == kind) return (long)i;
    return -1;
}

/* The cuMemAlloc block holding [p, p+n), or -1. */
static long heap_block_of(unsigned long long p, unsigned long long n) {
    unsigned long long h = (unsigned long long)heap;
    if (p < h || p + n > h + file_size) return -1;
    unsigned long long off = p - h;
    for (size_t i = 0; i < nblocks; i++)
        if (blocks[i].kind == 1 && blocks[i].off <= off && off + n <= blocks[i].off + blocks[i].size)
            return (long)i;
    return -1;
}

static int in_ranges(range_t *r, size_t n, unsigned long long p, unsigned long long len) {
    for (size_t i = 0; i < n; i++)
        if (r[i].start <= p && p + len <= r[i].start + r[i].size) return 1;
    return 0;
}

static long mapping_at(unsigned long long p) {
    for (size_t i = 0; i < nmaps; i++)
        if (mappings[i].start <= p && p < mappings[i].start + mappings[i].size) return (long)i;
    return -1;
}

/* Mappings with the access asked for (1 read, 3 read-write) tile [p, p+n) with no gap. */
static int mapped_accessible(unsigned long long p, unsigned long long n, int need) {
    while (n > 0) {
        long i = mapping_at(p);
        if (i < 0 || (mappings[i].access & need) != need) return 0;
        unsigned long long end = mappings[i].start + mappings[i].size;
        unsigned long long step = end - p < n ? end - p : n;
        p += step;
        n -= step;
    }
    return 1;
}

/* [p, p+n) may be read (write 0) or written (write 1) by the device. */
static int device_range_ok(unsigned long long p, unsigned long long n, int write) {
    if (n == 0) return 1;
    return heap_block_of(p, n) >= 0 || mapped_accessible(p, n, write ? 3 : 1)
        || in_ranges(host_ranges, nhost, p, n)
        || in_ranges(ipc_ranges, nipc, p, n);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ------------------------------------------------------------------ the work queue */
/*
 * Every asynchronous operation is an op. ops[] holds them sorted by id (ids only
 * grow, so appending keeps the order); run ops stay there, marked done, until
 * a compaction, and an id found nowhere is done. So the array holds what is
 * pending plus about as much again, even behind work never forced, and it is
 * emptied whenever nothing is pending: long runs stay small.
 */
enum { OP_COPY, OP_FILL, OP_MARKER };
/* What a side of a copy must still be when the copy runs: anything (pageable
   host memory, the caller's to keep valid), our staging buffer, registered
   host memory, or device memory. */
enum { MEM_HOST, MEM_STAGED, MEM_PINNED, MEM_DEVICE };

typedef struct {
    unsigned long long id;
    int kind, done;
    unsigned long long walk;     /* the run_until walk that last reached it */
    char *dst;
    const char *src;
    size_t n;                    /* copy: bytes; fill: elements of width bytes */
    int dst_mem, src_mem;
    char *staging;               /* HtoD from pageable memory: the source, copied */
    unsigned int value;
    size_t width;
    struct fake_event *event;    /* marker: the event it times, NULL once detached */
    unsigned long long *pre;     /* the ops it follows that were pending when queued */
    int npre;
} op_t;

static op_t *ops;
static size_t nops, cap_ops, ndone;
static unsigned long long next_op_id = 1, walks;
static unsigned long long *walk_stack, *walk_order;
static size_t cap_walk_stack, cap_walk_order;

static struct fake_stream legacy_stream;  /* handles 0 and CU_STREAM_LEGACY; blocking */
static struct fake_stream *streams;       /* created and per-thread streams */
static __thread struct fake_stream *thread_stream;  /* this thread's per-thread stream */
static __thread int ptds_call;  /* in a _ptsz/_ptds variant: stream 0 is the per-thread one */
static pthread_key_t thread_stream_key;
static pthread_once_t thread_stream_once = PTHREAD_ONCE_INIT;

static int event_delay;  /* NOT_READY answers for events recorded (and streams fed) from now */
static long long live_events, live_streams, pending_ops, executed_ops, illegal_accesses,
    events_recorded, event_queries, event_synchronizes;

__attribute__((constructor)) static void read_event_delay(void) {
    const char *env = getenv("NUMBA_BFC_FAKE_CUDA_EVENT_DELAY");
    event_delay = env ? atoi(env) : 0;
    if (event_delay < 0) event_delay = 0;
}

static op_t *find_op(unsigned long long id) {
    size_t lo = 0, hi = nops;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (ops[mid].id < id) lo = mid + 1;
        else hi = mid;
    }
    return lo < nops && ops[lo].id == id ? &ops[lo] : NULL;
}

static int op_pending(unsigned long long id) {
    op_t *o = id ? find_op(id) : NULL;
    return o && !o->done;
}

static void add_pre(op_t *o, unsigned long long id) {
    if (!op_pending(id)) return;  /* done work orders nothing */
    for (int i = 0; i < o->npre; i++)
        if (o->pre[i] == id) return;
    o->pre = realloc(o->pre, (size_t)(o->npre + 1) * sizeof *o->pre);
    if (!o->pre) abort();
    o->pre[o->npre++] = id;
}

static void unlink_stream(struct fake_stream *s) {
    for (struct fake_stream **p = &streams; *p; p = &(*p)->next)
        if (*p == s) { *p = s->next; return; }
}

static int run_until(unsigned long long id);

/* A thread ends: its per-thread stream goes, after its work (which the legacy
   stream could no longer order itself after). */
static void thread_stream_gone(void *p) {
    struct fake_stream *s = p;
    pthread_mutex_lock(&lock);
    run_until(s->last);
    unlink_stream(s);
    pthread_mutex_unlock(&lock);
    thread_stream = NULL;
    free(s);
}

static void make_thread_stream_key(void) {
    pthread_key_create(&thread_stream_key, thread_stream_gone);
}

/* Under the lock. The calling thread's per-thread default stream: a blocking stream. */
static struct fake_stream *per_thread_stream(void) {
    if (!thread_stream) {
        pthread_once(&thread_stream_once, make_thread_stream_key);
        thread_stream = calloc(1, sizeof *thread_stream);
        if (!thread_stream) abort();
        thread_stream->next = streams;
        streams = thread_stream;
        pthread_setspecific(thread_stream_key, thread_stream);
    }
    return thread_stream;
}

/* Under the lock. The stream a handle names. */
static struct fake_stream *stream_of(CUstream s) {
    if (s == NULL) return ptds_call ? per_thread_stream() : &legacy_stream;
    if (s == STREAM_LEGACY) return &legacy_stream;
    if (s == STREAM_PER_THREAD) return per_thread_stream();
    return s;
}

/* Under the lock. Queue o on s, after `also` too (0: nothing more); its id. */
static unsigned long long enqueue(op_t o, struct fake_stream *s, unsigned long long also) {
    o.pre = NULL;
    o.npre = 0;
    add_pre(&o, s->last);
    add_pre(&o, also);
    if (s == &legacy_stream) {
        for (struct fake_stream *t = streams; t; t = t->next)
            if (!(t->flags & CU_STREAM_NON_BLOCKING)) add_pre(&o, t->last);
    } else if (!(s->flags & CU_STREAM_NON_BLOCKING)) {
        add_pre(&o, legacy_stream.last);
    }
    o.id = next_op_id++;
    o.done = 0;
    o.walk = 0;
    ops = grow(ops, &cap_ops, nops + 1, sizeof *ops);
    ops[nops++] = o;
    pending_ops++;
    s->last = o.id;
    s->not_ready = event_delay;
    return o.id;
}

/* Copies and memsets check their memory again when they run: what was device
   memory when they were queued may have been unmapped since. */
static int side_ok(const char *p, size_t n, int mem, int write) {
    unsigned long long a = (unsigned long long)p;
    switch (mem) {
    case MEM_PINNED: return n == 0 || in_ranges(host_ranges, nhost, a, n);
    case MEM_DEVICE: return device_range_ok(a, n, write);
    default: return 1;
    }
}

static void retire(op_t *o) {
    free(o->staging);
    free(o->pre);
    o->staging = NULL;
    o->pre = NULL;
    o->npre = 0;
    o->event = NULL;
    o->done = 1;
    pending_ops--;
    ndone++;
}

/* Run one op whose prerequisites are done; 1 if it met an illegal address. */
static int exec_op(op_t *o) {
    int ok = 1;
    if (o->kind == OP_COPY) {
        ok = side_ok(o->dst, o->n, o->dst_mem, 1) && side_ok(o->src, o->n, o->src_mem, 0);
        if (ok) memmove(o->dst, o->src, o->n);
    } else if (o->kind == OP_FILL) {
        ok = side_ok(o->dst, o->n * o->width, MEM_DEVICE, 1);
        if (ok && o->width == 1) memset(o->dst, (int)o->value, o->n);
        else if (ok)
            for (size_t i = 0; i < o->n; i++) memcpy(o->dst + i * o->width, &o->value, o->width);
    } else if (o->event) {
        o->event->when = now_ms();
    }
    retire(o);
    executed_ops++;
    if (!ok) illegal_accesses++;
    return !ok;
}

/* Drop the done ops from the array once they are half of it, all of them (and
   most of its memory) once nothing is pending. */
static void compact(void) {
    if (pending_ops == 0) {
        nops = ndone = 0;
        if (cap_ops > 4096) { free(ops); ops = NULL; cap_ops = 0; }
    } else if (ndone > 64 && ndone * 2 > nops) {
        size_t k = 0;
        for (size_t i = 0; i < nops; i++)
            if (!ops[i].done) ops[k++] = ops[i];
        nops = k;
        ndone = 0;
    }
}

static void push_id(unsigned long long **arr, size_t *cap, size_t *n, unsigned long long id) {
    *arr = grow(*arr, cap, *n + 1, sizeof **arr);
    (*arr)[(*n)++] = id;
}

static int cmp_id(const void *a, const void *b) {
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}

/* Under the lock. Run op `id` and, first, every pending op it follows, directly
   or not (a walk with an explicit stack: chains are as long as the queue);
   the number of illegal accesses met. Prerequisites have smaller ids, so
   running what the walk reached in id order keeps every order. */
static int run_until(unsigned long long id) {
    op_t *o = id ? find_op(id) : NULL;
    if (!o || o->done) return 0;
    size_t nstack = 0, norder = 0;
    walks++;
    o->walk = walks;
    push_id(&walk_stack, &cap_walk_stack, &nstack, id);
    while (nstack) {
        unsigned long long x = walk_stack[--nstack];
        push_id(&walk_order, &cap_walk_order, &norder, x);
        o = find_op(x);
        for (int i = 0; i < o->npre; i++) {
            op_t *p = find_op(o->pre[i]);
            if (p && !p->done && p->walk != walks) {
                p->walk = walks;
                push_id(&walk_stack, &cap_walk_stack, &nstack, p->id);
            }
        }
    }
    qsort(walk_order, norder, sizeof *walk_order, cmp_id);
    int bad = 0;
    for (size_t i = 0; i < norder; i++) bad += exec_op(find_op(walk_order[i]));
    compact();
    return bad;
}

/* Under the lock. Run everything queued; the number of illegal accesses met. */
static int run_all(void) {
    int bad = 0;
    for (size_t i = 0; i < nops; i++)
        if (!ops[i].done) bad += exec_op(&ops[i]);
    compact();
    return bad;
}

/* Under the lock. A context destroyed: its queued work never runs. */
static void drop_all(void) {
    for (size_t i = 0; i < nops; i++)
        if (!ops[i].done) retire(&ops[i]);
    compact();
}

/* Under the lock: queue a copy (after the caller validated it) on stream s, and
   run it (and what it follows) when `now`. */
static CUresult queue_copy(char *dst, const char *src, size_t n, int dst_mem, int src_mem,
                           CUstream s, int now) {
    op_t o = {0};
    o.kind = OP_COPY;
    o.dst = dst;
    o.src = src;
    o.n = n;
    o.dst_mem = dst_mem;
    o.src_mem = src_mem;
    if (src_mem == MEM_STAGED) {
        /* The driver stages pageable memory: the caller may reuse it on return. */
        o.staging = malloc(n ? n : 1);
        if (!o.staging) return CUDA_ERROR_OUT_OF_MEMORY;
        memcpy(o.staging, src, n);
        o.src = o.staging;
    }
    unsigned long long id = enqueue(o, stream_of(s), 0);
    return now && run_until(id) ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}

/* The counters, in this order: live events (created minus destroyed), live
   streams (created minus destroyed; per-thread ones not counted), pending ops,
   executed ops (illegal ones included), illegal accesses, events recorded,
   cuEventQuery calls, cuEventSynchronize calls. Fills up to n of them into out;
   returns how many it wrote. */
int numba_bfc_fake_counters(long long *out, int n) {
    pthread_mutex_lock(&lock);
    long long v[] = {live_events, live_streams, pending_ops, executed_ops, illegal_accesses,
                     events_recorded, event_queries, event_synchronizes};
    pthread_mutex_unlock(&lock);
    int k = n < 0 ? 0 : n < (int)(sizeof v / sizeof v[0]) ? n : (int)(sizeof v / sizeof v[0]);
    if (out) memcpy(out, v, (size_t)k * sizeof v[0]);
    return out ? k : 0;
}

/* The NOT_READY answers events recorded (and streams fed) from now on give
   before they complete; returns the previous value. */
int numba_bfc_fake_set_event_delay(int n) {
    pthread_mutex_lock(&lock);
    int old = event_delay;
    event_delay = n < 0 ? 0 : n;
    pthread_mutex_unlock(&lock);
    return old;
}

/* ------------------------------------------------------------------ init, devices */
CUresult cuInit(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    CUresult rc = CUDA_SUCCESS;
    if (!initialized) {
        const char *env = getenv("NUMBA_BFC_FAKE_CUDA_MEMORY");
        total_memory = env ? strtoull(env, NULL, 0) : (4ull << 30);
        total_memory = align_up(total_memory, GRANULE);
        file_size = 2 * total_memory;  /* room for alignment padding; sparse */
        mem_fd = memfd_create("numba_bfc_fake_cuda_device", 0);
        if (mem_fd < 0 || ftruncate(mem_fd, (off_t)file_size) != 0) rc = CUDA_ERROR_OUT_OF_MEMORY;
        if (rc == CUDA_SUCCESS) {
            heap = mmap(NULL, file_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
                        mem_fd, 0);
            if (heap == MAP_FAILED) rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (rc == CUDA_SUCCESS) initialized = 1;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

CUresult cuDriverGetVersion(int *v) { *v = DRIVER_VERSION; return CUDA_SUCCESS; }

CUresult cuDeviceGetCount(int *count) {
    if (ensure_init()) return CUDA_ERROR_NOT_INITIALIZED;
    *count = 1;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    if (ensure_init()) return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *dev = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "numba_bfc fake CUDA device");
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    memcpy(uuid->bytes, "numba_bfc_fake_0", 16);
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev) {
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = total_memory;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, int attr, CUdevice dev) {
    if (ensure_init()) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    switch (attr) {  /* an H100's answers where they matter */
    case 75: *value = 9; break;            /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *value = 0; break;            /* COMPUTE_CAPABILITY_MINOR */
    case 1: *value = 1024; break;          /* MAX_THREADS_PER_BLOCK */
    case 2: *value = 1024; break;          /* MAX_BLOCK_DIM_X */
    case 3: case 4: *value = 1024; break;  /* MAX_BLOCK_DIM_Y/Z */
    case 5: *value = 2147483647; break;    /* MAX_GRID_DIM_X */
    case 6: case 7: *value = 65535; break;
    case 8: *value = 49152; break;         /* MAX_SHARED_MEMORY_PER_BLOCK */
    case 10: *value = 32; break;           /* WARP_SIZE */
    case 16: *value = 132; break;          /* MULTIPROCESSOR_COUNT */
    case 33: *value = 1; break;            /* PCI_BUS_ID */
    case 34: *value = 0; break;            /* PCI_DEVICE_ID */
    case 50: *value = 0; break;            /* PCI_DOMAIN_ID */
    case 18: *value = 0; break;            /* INTEGRATED */
    /* CAN_MAP_HOST_MEMORY, UNIFIED_ADDRESSING, MANAGED_MEMORY, CONCURRENT_MANAGED_ACCESS,
       VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED */
    case 19: case 41: case 83: case 89: case 102: case 103: *value = 1; break;
    case 115: *value = 0; break;           /* MEMORY_POOLS_SUPPORTED: not emulated */
    default: *value = 0;
    }
    return CUDA_SUCCESS;
}

CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev) {
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    *major = 9;
    *minor = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char *bus, int len, CUdevice dev) {
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(bus, (size_t)len, "0000:01:00.0");
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ contexts */
static void free_everything(void) {
    /* A destroyed context takes its memory and its queued work with it, as on
       a real device. */
    drop_all();
    for (size_t i = nblocks; i-- > 0;)
        if (blocks[i].kind == 1) drop_block(i);
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    if (ensure_init()) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    primary.retained++;
    primary.alive = 1;
    pthread_mutex_unlock(&lock);
    *ctx = &primary;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    CUresult rc = CUDA_SUCCESS;
    /* A release with no retain left is refused, after a reset too (seen on an
       H100 when a second cuda.close() followed the first). */
    if (primary.retained <= 0) rc = CUDA_ERROR_INVALID_CONTEXT;
    else if (--primary.retained == 0) { primary.alive = 0; free_everything(); }
    pthread_mutex_unlock(&lock);
    return rc;
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    free_everything();
    primary.retained = 0;
    primary.alive = 0;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    *flags = 0;
    *active = primary.alive;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
    (void)flags;
    return dev == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult cuCtxGetCurrent(CUcontext *ctx) {
    if (ensure_init()) return CUDA_ERROR_NOT_INITIALIZED;
    *ctx = ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
    if (ensure_init()) return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx == NULL) {
        if (ctx_depth) ctx_depth--;
    } else if (ctx_depth) {
        ctx_stack[ctx_depth - 1] = ctx;
    } else {
        ctx_stack[ctx_depth++] = ctx;
    }
    return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent(CUcontext ctx) {
    if (ensure_init()) return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx == NULL || ctx_depth == 64) return CUDA_ERROR_INVALID_VALUE;
    ctx_stack[ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext *ctx) {
    if (ensure_init()) return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext top = ctx_stack[--ctx_depth];
    if (ctx) *ctx = top;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *dev) {
    CUresult rc = need_context();
    if (rc) return rc;
    *dev = 0;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
    CUresult rc = need_context();
    if (rc) return rc;
    pthread_mutex_lock(&lock);
    int bad = run_all();
    pthread_mutex_unlock(&lock);
    return bad ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}

CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version) {
    (void)ctx;
    *version = 3020;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id) {
    if (ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
    *id = 1;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetFlags(unsigned int *flags) {
    *flags = 0;
    return need_context();
}

/* ------------------------------------------------------------------ plain device memory */
CUresult cuMemGetInfo(size_t *free_bytes, size_t *total) {
    CUresult rc = need_context();
    if (rc) return rc;
    pthread_mutex_lock(&lock);
    *free_bytes = total_memory - used_memory;
    *total = total_memory;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc(CUdeviceptr *dptr, size_t size) {
    CUresult rc = need_context();
    if (rc) return rc;
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    /* The real driver aligns large allocations to 2 MiB, small ones to 512 B. */
    unsigned long long off = take_file_range(size, size >= GRANULE ? GRANULE : 512, 1);
    pthread_mutex_unlock(&lock);
    if (off == ~0ull) return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = (CUdeviceptr)(heap + off);
    return CUDA_SUCCESS;
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags) {
    (void)flags;
    return cuMemAlloc(dptr, size);
}

CUresult cuMemFree(CUdeviceptr dptr) {
    /* No current context needed: the address names it (unified addressing).
       Numba frees this way after popping every context in cuda.close(). */
    CUresult rc = ensure_init();
    if (rc) return rc;
    pthread_mutex_lock(&lock);
    /* The real driver synchronizes the device here: queued work on the block
       runs before it goes. */
    int bad = run_all();
    long i = -1;
    if (dptr >= (CUdeviceptr)heap && dptr < (CUdeviceptr)heap + file_size)
        i = find_block(dptr - (CUdeviceptr)heap, 1);
    if (i >= 0) drop_block((size_t)i);
    pthread_mutex_unlock(&lock);
    return i < 0 ? CUDA_ERROR_INVALID_VALUE : bad ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr dptr) {
    CUresult rc = need_context();
    if (rc) return rc;
    pthread_mutex_lock(&lock);
    long i = heap_block_of(dptr, 1);
    long m = i < 0 ? mapping_at(dptr) : -1;
    if (i >= 0) {
        if (base) *base = (CUdeviceptr)heap + blocks[i].off;
        if (size) *size = blocks[i].size;
    } else if (m >= 0) {
        if (base) *base = mappings[m].start;
        if (size) *size = mappings[m].size;
    }
    pthread_mutex_unlock(&lock);
    return i >= 0 || m >= 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* ------------------------------------------------------------------ copies and memsets */
static int pinned(const void *p, size_t n) {
    return in_ranges(host_ranges, nhost, (unsigned long long)p, n);
}

/* A copy, validated now and queued on stream s. Synchronous copies (async 0)
   are on the default stream (s NULL) and return done. Async ones return at
   once, except into pageable host memory (the driver must finish before the
   caller can see the bytes); from pageable host memory they stage the source. */
static CUresult copy(void *dst, const void *src, size_t n, int dst_dev, int src_dev, CUstream s,
                     int async) {
    CUresult rc = need_context();
    if (rc) return rc;
    pthread_mutex_lock(&lock);
    int ok = (!dst_dev || device_range_ok((unsigned long long)dst, n, 1))
          && (!src_dev || device_range_ok((unsigned long long)src, n, 0));
    if (ok) {
        int dst_mem = dst_dev ? MEM_DEVICE : async && pinned(dst, n) ? MEM_PINNED : MEM_HOST;
        int src_mem = src_dev ? MEM_DEVICE : !async ? MEM_HOST
                    : pinned(src, n) ? MEM_PINNED : MEM_STAGED;
        rc = queue_copy(dst, src, n, dst_mem, src_mem, s, !async || dst_mem == MEM_HOST);
    }
    pthread_mutex_unlock(&lock);
    return ok ? rc : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n) {
    return copy((void *)dst, src, n, 1, 0, NULL, 0);
}
CUresult cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n) {
    return copy(dst, (const void *)src, n, 0, 1, NULL, 0);
}
CUresult cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    return copy((void *)dst, (const void *)src, n, 1, 1, NULL, 0);
}
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    return copy((void *)dst, (const void *)src, n, 1, 1, NULL, 0);
}
CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    return copy((void *)dst, src, n, 1, 0, s, 1);
}
CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    return copy(dst, (const void *)src, n, 0, 1, s, 1);
}
CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    return copy((void *)dst, (const void *)src, n, 1, 1, s, 1);
}
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    return copy((void *)dst, (const void *)src, n, 1, 1, s, 1);
}

/* A memset of count elements of width bytes, queued on stream s. Even the
   synchronous ones (async 0, on the default stream) return before they run,
   except into pinned host memory. */
static CUresult fill(CUdeviceptr dst, unsigned int value, size_t count, size_t width, CUstream s,
                     int async) {
    CUresult rc = need_context();
    if (rc) return rc;
    pthread_mutex_lock(&lock);
    int ok = device_range_ok(dst, count * width, 1), bad = 0;
    if (ok) {
        op_t o = {0};
        o.kind = OP_FILL;
        o.dst = (char *)dst;
        o.n = count;
        o.width = width;
        o.value = value;
        unsigned long long id = enqueue(o, stream_of(s), 0);
        if (!async && pinned((void *)dst, count * width)) bad = run_until(id);
    }
    pthread_mutex_unlock(&lock);
    return !ok ? CUDA_ERROR_INVALID_VALUE : bad ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}

CUresult cuMemsetD8(CUdeviceptr d, unsigned char v, size_t n) { return fill(d, v, n, 1, NULL, 0); }
CUresult cuMemsetD16(CUdeviceptr d, unsigned short v, size_t n) { return fill(d, v, n, 2, NULL, 0); }
CUresult cuMemsetD32(CUdeviceptr d, unsigned int v, size_t n) { return fill(d, v, n, 4, NULL, 0); }
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
    return fill(d, v, n, 1, s, 1);
}
CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) {
    return fill(d, v, n, 2, s, 1);
}
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s) {
    return fill(d, v, n, 4, s, 1);
}

/* ------------------------------------------------------------------ host memory */
static void add_range(range_t **r, size_t *n, size_t *cap, unsigned long long p,
                      unsigned long long size) {
    *r = grow(*r, cap, *n + 1, sizeof **r);
    (*r)[(*n)++] = (range_t){p, size};
}

static int remove_range(range_t *r, size_t *n, unsigned long long p) {
    for (size_t i = 0; i < *n; i++)
        if (r[i].start == p) {
            r[i] = r[--*n];
            return 1;
        }
    return 0;
}

CUresult cuMemHostRegister(void *p, size_t size, unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    add_range(&host_ranges, &nhost, &cap_host, (unsigned long long)p, size);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

/* As the real driver, synchronize first: queued copies to or from the memory
   run while it is still pinned. *bad: illegal accesses met doing so. */
static CUresult host_unregister(void *p, int *bad) {
    pthread_mutex_lock(&lock);
    *bad = run_all();
    int ok = remove_range(host_ranges, &nhost, (unsigned long long)p);
    pthread_mutex_unlock(&lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemHostUnregister(void *p) {
    int bad;
    CUresult rc = host_unregister(p, &bad);
    return rc ? rc : bad ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
    CUresult rc = need_context();
    if (rc) return rc;
    void *p = NULL;
    if (posix_memalign(&p, PAGE, size ? size : 1)) return CUDA_ERROR_OUT_OF_MEMORY;
    *pp = p;
    return cuMemHostRegister(p, size, flags);
}

CUresult cuMemFreeHost(void *p) {
    int bad;
    CUresult rc = host_unregister(p, &bad);
    if (rc == CUDA_SUCCESS) free(p);
    return rc ? rc : bad ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}

CUresult cuMemHostGetDevicePointer(CUdeviceptr *dptr, void *p, unsigned int flags) {
    (void)flags;
    *dptr = (CUdeviceptr)p;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ IPC */
#define IPC_MAGIC "numba_bfc_fake"
typedef struct {
    char magic[16];
    int pid, fd;
    unsigned long long off, size;
} ipc_payload_t;

CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr) {
    CUresult rc = need_context();
    if (rc) return rc;
    pthread_mutex_lock(&lock);
    long i = -1;
    if (dptr >= (CUdeviceptr)heap && dptr < (CUdeviceptr)heap + file_size)
        i = find_block(dptr - (CUdeviceptr)heap, 1);  /* only an allocation's base */
    ipc_payload_t pl = {IPC_MAGIC, getpid(), mem_fd, 0, 0};
    if (i >= 0) { pl.off = blocks[i].off; pl.size = blocks[i].size; }
    pthread_mutex_unlock(&lock);
    if (i < 0) return CUDA_ERROR_INVALID_VALUE;
    memset(handle, 0, sizeof *handle);
    memcpy(handle->reserved, &pl, sizeof pl);
    return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle(CUdeviceptr *dptr, CUipcMemHandle handle, unsigned int flags) {
    (void)flags;
    CUresult rc = need_context();
    if (rc) return rc;
    ipc_payload_t pl;
    memcpy(&pl, handle.reserved, sizeof pl);
    if (memcmp(pl.magic, IPC_MAGIC, sizeof IPC_MAGIC) != 0) return CUDA_ERROR_INVALID_VALUE;
    if (pl.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;  /* as the driver: not in-process */
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pl.pid, pl.fd);
    int fd = open(path, O_RDWR);
    if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;
    unsigned long long start = pl.off / PAGE * PAGE, delta = pl.off - start;
    char *p = mmap(NULL, pl.size + delta, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
    close(fd);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    add_range(&ipc_ranges, &nipc, &cap_ipc, (unsigned long long)(p + delta), pl.size);
    pthread_mutex_unlock(&lock);
    *dptr = (CUdeviceptr)(p + delta);
    return CUDA_SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
    pthread_mutex_lock(&lock);
    unsigned long long size = 0;
    for (size_t i = 0; i < nipc; i++)
        if (ipc_ranges[i].start == dptr) size = ipc_ranges[i].size;
    int ok = remove_range(ipc_ranges, &nipc, dptr);
    pthread_mutex_unlock(&lock);
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    unsigned long long start = dptr / PAGE * PAGE;
    munmap((void *)start, size + (dptr - start));
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ streams, events */
static int special_stream(CUstream s) {
    return s == NULL || s == STREAM_LEGACY || s == STREAM_PER_THREAD;
}

CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
    CUresult rc = need_context();
    if (rc) return rc;
    struct fake_stream *st = calloc(1, sizeof *st);
    if (!st) return CUDA_ERROR_OUT_OF_MEMORY;
    st->flags = (int)flags;
    pthread_mutex_lock(&lock);
    st->next = streams;
    streams = st;
    live_streams++;
    pthread_mutex_unlock(&lock);
    *s = st;
    return CUDA_SUCCESS;
}
CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int priority) {
    (void)priority;
    return cuStreamCreate(s, flags);
}
CUresult cuStreamDestroy(CUstream s) {
    if (special_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&lock);
    /* Its queued work still runs (a real device finishes it after the call
       returns); running it now keeps the order the legacy stream had with it. */
    int bad = run_until(s->last);
    unlink_stream(s);
    live_streams--;
    pthread_mutex_unlock(&lock);
    free(s);
    return bad ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}
CUresult cuStreamSynchronize(CUstream s) {
    CUresult rc = need_context();
    if (rc) return rc;
    pthread_mutex_lock(&lock);
    int bad = run_until(stream_of(s)->last);
    pthread_mutex_unlock(&lock);
    return bad ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}
CUresult cuStreamQuery(CUstream s) {
    CUresult rc = need_context();
    if (rc) return rc;
    pthread_mutex_lock(&lock);
    struct fake_stream *st = stream_of(s);
    if (!op_pending(st->last)) rc = CUDA_SUCCESS;
    else if (st->not_ready > 0) { st->not_ready--; rc = CUDA_ERROR_NOT_READY; }
    else rc = run_until(st->last) ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
    pthread_mutex_unlock(&lock);
    return rc;
}
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
    (void)flags;
    CUresult rc = need_context();
    if (rc) return rc;
    pthread_mutex_lock(&lock);
    op_t o = {0};
    o.kind = OP_MARKER;
    /* An event never recorded orders nothing, as in CUDA. */
    enqueue(o, stream_of(s), e && e->recorded ? e->marker : 0);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
CUresult cuStreamGetFlags(CUstream s, unsigned int *flags) {
    *flags = special_stream(s) ? 0 : (unsigned int)s->flags;
    return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent *e, unsigned int flags) {
    (void)flags;
    CUresult rc = need_context();
    if (rc) return rc;
    *e = calloc(1, sizeof **e);
    if (!*e) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    live_events++;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

/* Under the lock: e's pending marker, if any, no longer times it. */
static void detach_marker(CUevent e) {
    op_t *o = e->recorded ? find_op(e->marker) : NULL;
    if (o && !o->done) o->event = NULL;
}

CUresult cuEventDestroy(CUevent e) {
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&lock);
    detach_marker(e);  /* destroying an event with a pending record is legal */
    live_events--;
    pthread_mutex_unlock(&lock);
    free(e);
    return CUDA_SUCCESS;
}
CUresult cuEventRecord(CUevent e, CUstream s) {
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&lock);
    detach_marker(e);  /* a record replaces the previous one */
    op_t o = {0};
    o.kind = OP_MARKER;
    o.event = e;
    e->marker = enqueue(o, stream_of(s), 0);
    e->recorded = 1;
    e->not_ready = event_delay;
    events_recorded++;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
CUresult cuEventSynchronize(CUevent e) {
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&lock);
    event_synchronizes++;
    int bad = e->recorded ? run_until(e->marker) : 0;
    pthread_mutex_unlock(&lock);
    return bad ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}
CUresult cuEventQuery(CUevent e) {
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc;
    pthread_mutex_lock(&lock);
    event_queries++;
    if (!e->recorded || !op_pending(e->marker)) rc = CUDA_SUCCESS;
    else if (e->not_ready > 0) { e->not_ready--; rc = CUDA_ERROR_NOT_READY; }
    else rc = run_until(e->marker) ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
    pthread_mutex_unlock(&lock);
    return rc;
}
CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
    if (!start || !end) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&lock);
    int bad = (start->recorded ? run_until(start->marker) : 0)
            + (end->recorded ? run_until(end->marker) : 0);
    int recorded = start->recorded && end->recorded;
    if (recorded) *ms = (float)(end->when - start->when);
    pthread_mutex_unlock(&lock);
    if (!recorded) return CUDA_ERROR_INVALID_HANDLE;
    return bad ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ virtual memory */
CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option) {
    if (prop == NULL || prop->type != 1 || prop->location.type != 1 || prop->location.id != 0
        || (option != 0 && option != 1))
        return CUDA_ERROR_INVALID_VALUE;
    *g = GRANULE;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
    (void)addr;
    if (ensure_init()) return CUDA_ERROR_NOT_INITIALIZED;
    if (size == 0 || size % GRANULE || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (alignment == 0) alignment = GRANULE;
    char *p = mmap(NULL, size + alignment, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    unsigned long long start = align_up((unsigned long long)p, alignment);
    if (start > (unsigned long long)p) munmap(p, start - (unsigned long long)p);
    unsigned long long end = (unsigned long long)p + size + alignment;
    if (end > start + size) munmap((void *)(start + size), end - start - size);
    pthread_mutex_lock(&lock);
    add_range(&reservations, &nres, &cap_res, start, size);
    pthread_mutex_unlock(&lock);
    *ptr = start;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    pthread_mutex_lock(&lock);
    CUresult rc = CUDA_SUCCESS;
    long r = -1;
    for (size_t i = 0; i < nres; i++)
        if (reservations[i].start == ptr && reservations[i].size == size) r = (long)i;
    if (r < 0) rc = CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; rc == CUDA_SUCCESS && i < nmaps; i++)
        if (mappings[i].start >= ptr && mappings[i].start < ptr + size) rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) remove_range(reservations, &nres, ptr);
    pthread_mutex_unlock(&lock);
    if (rc == CUDA_SUCCESS) munmap((void *)ptr, size);
    return rc;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags) {
    CUresult rc = ensure_init();  /* the location is in prop: no context needed */
    if (rc) return rc;
    if (prop == NULL || prop->type != 1 || prop->location.type != 1 || prop->location.id != 0
        || flags != 0 || size == 0 || size % GRANULE)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    unsigned long long off = take_file_range(size, GRANULE, 2);
    pthread_mutex_unlock(&lock);
    if (off == ~0ull) return CUDA_ERROR_OUT_OF_MEMORY;
    *handle = off + GRANULE;  /* never 0 */
    return CUDA_SUCCESS;
}

static long handle_block(CUmemGenericAllocationHandle h) {
    return h < GRANULE ? -1 : find_block(h - GRANULE, 2);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    pthread_mutex_lock(&lock);
    long i = handle_block(h);
    CUresult rc = CUDA_SUCCESS;
    if (i < 0 || blocks[i].released) rc = CUDA_ERROR_INVALID_VALUE;
    else if (blocks[i].maps == 0) drop_block((size_t)i);
    else blocks[i].released = 1;  /* freed when its last mapping goes, as CUDA does */
    pthread_mutex_unlock(&lock);
    return rc;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                  unsigned long long flags) {
    CUresult rc = ensure_init();
    if (rc) return rc;
    pthread_mutex_lock(&lock);
    long i = handle_block(h);
    if (i < 0 || blocks[i].released || flags != 0 || ptr % GRANULE || size % GRANULE
        || offset % GRANULE || offset + size > blocks[i].size
        || !in_ranges(reservations, nres, ptr, size))
        rc = CUDA_ERROR_INVALID_VALUE;
    for (size_t m = 0; rc == CUDA_SUCCESS && m < nmaps; m++)
        if (mappings[m].start < ptr + size && ptr < mappings[m].start + mappings[m].size)
            rc = CUDA_ERROR_ALREADY_MAPPED;
    if (rc == CUDA_SUCCESS) {
        void *p = mmap((void *)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, mem_fd,
                       (off_t)(blocks[i].off + offset));
        if (p == MAP_FAILED) rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (rc == CUDA_SUCCESS) {
        mappings = grow(mappings, &cap_maps, nmaps + 1, sizeof *mappings);
        mappings[nmaps++] = (mapping_t){ptr, size, blocks[i].off, 0};
        blocks[i].maps++;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    CUresult rc = ensure_init();
    if (rc) return rc;
    if (count != 1 || desc[0].location.type != 1 || desc[0].location.id != 0)
        return CUDA_ERROR_INVALID_VALUE;
    int prot = desc[0].flags == 3 ? PROT_READ | PROT_WRITE : desc[0].flags == 1 ? PROT_READ
             : PROT_NONE;
    pthread_mutex_lock(&lock);
    /* The range must be tiled by whole mappings. */
    unsigned long long p = ptr;
    while (rc == CUDA_SUCCESS && p < ptr + size) {
        long m = mapping_at(p);
        if (m < 0 || mappings[m].start != p || p + mappings[m].size > ptr + size)
            rc = CUDA_ERROR_INVALID_VALUE;
        else p += mappings[m].size;
    }
    if (rc == CUDA_SUCCESS && size == 0) rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        mprotect((void *)ptr, size, prot);
        for (p = ptr; p < ptr + size;) {
            long m = mapping_at(p);
            mappings[m].access = prot == PROT_NONE ? 0 : prot & PROT_WRITE ? 3 : 1;
            p += mappings[m].size;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    CUresult rc = ensure_init();
    if (rc) return rc;
    pthread_mutex_lock(&lock);
    unsigned long long p = ptr;
    while (rc == CUDA_SUCCESS && p < ptr + size) {
        long m = mapping_at(p);
        if (m < 0) rc = CUDA_ERROR_NOT_MAPPED;
        else if (mappings[m].start != p || p + mappings[m].size > ptr + size)
            rc = CUDA_ERROR_INVALID_VALUE;  /* part of a mapping */
        else p += mappings[m].size;
    }
    if (rc == CUDA_SUCCESS && size == 0) rc = CUDA_ERROR_INVALID_VALUE;
    /* No synchronization, as on the real driver: work queued on the range
       finds it gone when it runs (an illegal access). */
    while (rc == CUDA_SUCCESS && ptr < p) {
        long m = mapping_at(ptr);
        mapping_t mp = mappings[m];
        mappings[m] = mappings[--nmaps];
        /* Back to reserved address space. */
        mmap((void *)mp.start, mp.size, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        for (size_t i = 0; i < nblocks; i++)
            if (blocks[i].kind == 2 && blocks[i].off <= mp.handle_off
                && mp.handle_off < blocks[i].off + blocks[i].size) {
                if (--blocks[i].maps == 0 && blocks[i].released) drop_block(i);
                break;
            }
        ptr = mp.start + mp.size;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* ------------------------------------------------------------------ errors */
CUresult cuGetErrorName(CUresult error, const char **s) {
    (void)error;
    *s = "CUDA_ERROR_FAKE";
    return CUDA_SUCCESS;
}
CUresult cuGetErrorString(CUresult error, const char **s) {
    (void)error;
    *s = "an error of the numba_bfc fake CUDA driver";
    return CUDA_SUCCESS;
}

/* Kernels cannot run here: module loading fails cleanly. */
CUresult cuModuleLoadData(void **module, const void *image) {
    (void)module; (void)image;
    return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult cuLibraryLoadData(void **lib, const void *code, void *a, void *b, unsigned int c,
                           void *d, void *e, unsigned int f) {
    (void)lib; (void)code; (void)a; (void)b; (void)c; (void)d; (void)e; (void)f;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ------------------------------------------------------------------ the lookup */
/* Versioned exports under the names the real library has, for ctypes users. */
#define ALIAS(name, target) __attribute__((alias(#target))) typeof(target) name;
ALIAS(cuMemAlloc_v2, cuMemAlloc)
ALIAS(cuMemFree_v2, cuMemFree)
ALIAS(cuMemGetInfo_v2, cuMemGetInfo)
ALIAS(cuMemGetAddressRange_v2, cuMemGetAddressRange)
ALIAS(cuMemcpyHtoD_v2, cuMemcpyHtoD)
ALIAS(cuMemcpyDtoH_v2, cuMemcpyDtoH)
ALIAS(cuMemcpyDtoD_v2, cuMemcpyDtoD)
ALIAS(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync)
ALIAS(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync)
ALIAS(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync)
ALIAS(cuMemsetD8_v2, cuMemsetD8)
ALIAS(cuMemsetD16_v2, cuMemsetD16)
ALIAS(cuMemsetD32_v2, cuMemsetD32)
ALIAS(cuMemHostGetDevicePointer_v2, cuMemHostGetDevicePointer)
ALIAS(cuMemHostRegister_v2, cuMemHostRegister)
ALIAS(cuDeviceTotalMem_v2, cuDeviceTotalMem)
ALIAS(cuDeviceGetUuid_v2, cuDeviceGetUuid)
ALIAS(cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease)
ALIAS(cuDevicePrimaryCtxReset_v2, cuDevicePrimaryCtxReset)
ALIAS(cuDevicePrimaryCtxSetFlags_v2, cuDevicePrimaryCtxSetFlags)
ALIAS(cuCtxPushCurrent_v2, cuCtxPushCurrent)
ALIAS(cuCtxPopCurrent_v2, cuCtxPopCurrent)
ALIAS(cuIpcOpenMemHandle_v2, cuIpcOpenMemHandle)
ALIAS(cuStreamDestroy_v2, cuStreamDestroy)
ALIAS(cuEventDestroy_v2, cuEventDestroy)
ALIAS(cuEventElapsedTime_v2, cuEventElapsedTime)

/* Per-thread default stream variants: the same function with stream 0 (and
   the default stream of the synchronous calls) meaning the calling thread's
   per-thread stream. cuGetProcAddress hands them out for
   CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, as the real driver does:
   <name>_ptsz for calls that take a stream, <name>_ptds for those that use
   the default stream implicitly. */
#define PER_THREAD(variant, base, params, args)          \
    CUresult variant params {                            \
        int was = ptds_call;                             \
        ptds_call = 1;                                   \
        CUresult rc = base args;                         \
        ptds_call = was;                                 \
        return rc;                                       \
    }
PER_THREAD(cuMemcpyHtoDAsync_ptsz, cuMemcpyHtoDAsync,
           (CUdeviceptr d, const void *h, size_t n, CUstream s), (d, h, n, s))
PER_THREAD(cuMemcpyDtoHAsync_ptsz, cuMemcpyDtoHAsync,
           (void *h, CUdeviceptr d, size_t n, CUstream s), (h, d, n, s))
PER_THREAD(cuMemcpyDtoDAsync_ptsz, cuMemcpyDtoDAsync,
           (CUdeviceptr d, CUdeviceptr e, size_t n, CUstream s), (d, e, n, s))
PER_THREAD(cuMemcpyAsync_ptsz, cuMemcpyAsync,
           (CUdeviceptr d, CUdeviceptr e, size_t n, CUstream s), (d, e, n, s))
PER_THREAD(cuMemsetD8Async_ptsz, cuMemsetD8Async,
           (CUdeviceptr d, unsigned char v, size_t n, CUstream s), (d, v, n, s))
PER_THREAD(cuMemsetD16Async_ptsz, cuMemsetD16Async,
           (CUdeviceptr d, unsigned short v, size_t n, CUstream s), (d, v, n, s))
PER_THREAD(cuMemsetD32Async_ptsz, cuMemsetD32Async,
           (CUdeviceptr d, unsigned int v, size_t n, CUstream s), (d, v, n, s))
PER_THREAD(cuEventRecord_ptsz, cuEventRecord, (CUevent e, CUstream s), (e, s))
PER_THREAD(cuStreamSynchronize_ptsz, cuStreamSynchronize, (CUstream s), (s))
PER_THREAD(cuStreamQuery_ptsz, cuStreamQuery, (CUstream s), (s))
PER_THREAD(cuStreamWaitEvent_ptsz, cuStreamWaitEvent, (CUstream s, CUevent e, unsigned int f),
           (s, e, f))
PER_THREAD(cuStreamGetFlags_ptsz, cuStreamGetFlags, (CUstream s, unsigned int *f), (s, f))
PER_THREAD(cuMemcpyHtoD_ptds, cuMemcpyHtoD, (CUdeviceptr d, const void *h, size_t n), (d, h, n))
PER_THREAD(cuMemcpyDtoH_ptds, cuMemcpyDtoH, (void *h, CUdeviceptr d, size_t n), (h, d, n))
PER_THREAD(cuMemcpyDtoD_ptds, cuMemcpyDtoD, (CUdeviceptr d, CUdeviceptr e, size_t n), (d, e, n))
PER_THREAD(cuMemcpy_ptds, cuMemcpy, (CUdeviceptr d, CUdeviceptr e, size_t n), (d, e, n))
PER_THREAD(cuMemsetD8_ptds, cuMemsetD8, (CUdeviceptr d, unsigned char v, size_t n), (d, v, n))
PER_THREAD(cuMemsetD16_ptds, cuMemsetD16, (CUdeviceptr d, unsigned short v, size_t n), (d, v, n))
PER_THREAD(cuMemsetD32_ptds, cuMemsetD32, (CUdeviceptr d, unsigned int v, size_t n), (d, v, n))
/* ... and under the real library's versioned names. */
ALIAS(cuMemcpyHtoDAsync_v2_ptsz, cuMemcpyHtoDAsync_ptsz)
ALIAS(cuMemcpyDtoHAsync_v2_ptsz, cuMemcpyDtoHAsync_ptsz)
ALIAS(cuMemcpyDtoDAsync_v2_ptsz, cuMemcpyDtoDAsync_ptsz)
ALIAS(cuMemcpyHtoD_v2_ptds, cuMemcpyHtoD_ptds)
ALIAS(cuMemcpyDtoH_v2_ptds, cuMemcpyDtoH_ptds)
ALIAS(cuMemcpyDtoD_v2_ptds, cuMemcpyDtoD_ptds)
ALIAS(cuMemsetD8_v2_ptds, cuMemsetD8_ptds)
ALIAS(cuMemsetD16_v2_ptds, cuMemsetD16_ptds)
ALIAS(cuMemsetD32_v2_ptds, cuMemsetD32_ptds)

typedef int CUdriverProcAddressQueryResult;

static void *self_handle(void) {
    static void *h;
    if (!h) {
        Dl_info info;
        if (dladdr((void *)cuInit, &info) && info.dli_fname)
            h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    }
    return h;
}

/* This library's own function of that name, never one of a library it links. */
static void *own_symbol(const char *name) {
    void *h = self_handle();
    void *f = h ? dlsym(h, name) : NULL;
    Dl_info mine, found;
    if (f && !(dladdr((void *)cuInit, &mine) && dladdr(f, &found)
               && mine.dli_fbase == found.dli_fbase))
        f = NULL;
    return f;
}

#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
    (void)version;
    void *f = NULL;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        /* cuda-bindings asks this way under CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1. */
        static const char *suffixes[] = {"_ptsz", "_ptds"};
        for (int i = 0; !f && i < 2; i++) {
            char name[256];
            if (snprintf(name, sizeof name, "%s%s", symbol, suffixes[i]) < (int)sizeof name)
                f = own_symbol(name);
        }
    }
    if (!f) f = own_symbol(symbol);
    *pfn = f;
    if (status) *status = f ? 0 : 1;  /* CU_GET_PROC_ADDRESS_SUCCESS / SYMBOL_NOT_FOUND */
    return f ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
