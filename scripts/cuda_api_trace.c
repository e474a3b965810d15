// cuda_api_trace.c: where a process's threads wait inside the CUDA driver. An injection library
// (the driver loads the file named by CUDA_INJECTION64_PATH at its initialization and calls
// InitializeInjection) that times every driver API call with CUPTI's callback API, per thread,
// and prints at exit, for the thread that launched the most work (the trainer's) and for all the
// other threads together (the loader's workers: nvJPEG calls the driver from them), the calls
// that took the most time: count, total, mean and largest.
// What it is for: data/PERF.md's open question, why nvJPEG's hardware decode takes 4-5x longer
// beside a replayed CUDA graph than beside the same kernels launched one by one. Run the same
// end-to-end benchmark with train.cuda_graphs = on and off under it and compare the workers'
// table: the call whose time grows is where they wait.
//
// Build: the target cuda_api_trace (CUDA builds where CMake finds CUPTI). Run:
//   CUDA_INJECTION64_PATH=$PWD/build-gpu/libcuda_api_trace.so build-gpu/swin_train CONFIG ...
// CUDA_API_TRACE_SKIP_S=N (default 0): calls that begin in the first N seconds after the driver's
// initialization are not counted (start-up and warm-up). The tables go to stderr; the last one
// says who made the memory and stream calls (allocations, frees, stream creation and
// destruction): per call, the library of the first frame above the CUDA driver and the runtime
// (dladdr of each frame of backtrace: libnvjpeg, libcublasLt, or the program itself, whose
// frames it prints as offsets for addr2line), with the nearest exported symbol where there is one.
#define _GNU_SOURCE
#include <cupti.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { CALLS = CUPTI_DRIVER_TRACE_CBID_SIZE, TOP = 15, CALLERS = 48, FRAMES = 32 };

// One thread's sums per driver function (indexed by CUPTI's callback id).
typedef struct ThreadStats {
  uint64_t count[CALLS], total_ns[CALLS], max_ns[CALLS];
  uint64_t launches;  // kernels and graphs it launched: the trainer's thread has the most
  struct ThreadStats *next;
} ThreadStats;

static CUpti_SubscriberHandle subscriber;
static pthread_mutex_t threads_lock = PTHREAD_MUTEX_INITIALIZER;
static ThreadStats *threads;        // every thread that called the driver, newest first
static const char *names[CALLS];    // the functions' names, as CUPTI gives them
static uint64_t start_ns, skip_ns;  // the driver's initialization; calls before start + skip
static _Thread_local ThreadStats *mine;

// Who made the watched calls: per (function, caller), the count and total time.
typedef struct {
  CUpti_CallbackId id;
  char where[192];
  uint64_t count, total_ns;
} Caller;
static pthread_mutex_t callers_lock = PTHREAD_MUTEX_INITIALIZER;
static Caller callers[CALLERS];
static int ncallers;
static uint64_t callers_dropped;  // calls whose caller did not fit the table

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static ThreadStats *this_thread(void) {
  if (mine) return mine;
  mine = calloc(1, sizeof *mine);
  if (!mine) {
    fprintf(stderr, "cuda_api_trace: out of memory\n");
    abort();
  }
  pthread_mutex_lock(&threads_lock);
  mine->next = threads;
  threads = mine;
  pthread_mutex_unlock(&threads_lock);
  return mine;
}

static bool is_launch(CUpti_CallbackId id) {
  return id == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel ||
         id == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz ||
         id == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx ||
         id == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz ||
         id == CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch ||
         id == CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz;
}

static bool is_watched(CUpti_CallbackId id) {
  switch (id) {
    case CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemHostAlloc:
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemFreeHost:
    case CUPTI_DRIVER_TRACE_CBID_cuStreamCreate:
    case CUPTI_DRIVER_TRACE_CBID_cuStreamCreateWithPriority:
    case CUPTI_DRIVER_TRACE_CBID_cuStreamDestroy_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync:
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync:
    case CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync:
      return true;
    default:
      return false;
  }
}

static const char *base_name(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

// Frames inside the driver, CUPTI, this library or the CUDA runtime are not the caller.
static bool is_cuda_internal(const char *lib) {
  return strncmp(lib, "libcuda.so", 10) == 0 || strncmp(lib, "libcupti", 8) == 0 ||
         strncmp(lib, "libcudart", 9) == 0 || strstr(lib, "cuda_api_trace") != NULL ||
         strncmp(lib, "libc.so", 7) == 0;
}

// The caller of the running call: the first frame's library outside the CUDA internals, its
// nearest exported symbol (or its offset in the library, for addr2line), then the next library
// up the stack, as "libnvjpeg.so.13 nvjpegDecodeBatched <- swin_train+0x1a2b3".
static void where_called(char *out, size_t size) {
  void *frames[FRAMES];
  int n = backtrace(frames, FRAMES);
  size_t used = 0;
  const char *last = NULL;
  out[0] = 0;
  for (int i = 0, shown = 0; i < n && shown < 2; i++) {
    Dl_info info;
    if (!dladdr(frames[i], &info) || !info.dli_fname) continue;
    const char *lib = base_name(info.dli_fname);
    if (is_cuda_internal(lib) || (last && strcmp(lib, last) == 0)) continue;
    int w =
        info.dli_sname
            ? snprintf(out + used, size - used, "%s%s %s", shown ? " <- " : "", lib, info.dli_sname)
            : snprintf(out + used, size - used, "%s%s+0x%lx", shown ? " <- " : "", lib,
                       (unsigned long)((char *)frames[i] - (char *)info.dli_fbase));
    if (w < 0 || (size_t)w >= size - used) break;
    used += (size_t)w;
    last = lib;
    shown++;
  }
  if (!out[0]) snprintf(out, size, "?");
}

static void count_caller(CUpti_CallbackId id, uint64_t dt) {
  char where[192];
  where_called(where, sizeof where);
  pthread_mutex_lock(&callers_lock);
  int k = 0;
  while (k < ncallers && (callers[k].id != id || strcmp(callers[k].where, where) != 0)) k++;
  if (k == ncallers && ncallers < CALLERS) {
    callers[k] = (Caller){.id = id};
    snprintf(callers[k].where, sizeof callers[k].where, "%s", where);
    ncallers++;
  }
  if (k < ncallers) {
    callers[k].count++;
    callers[k].total_ns += dt;
  } else {
    callers_dropped++;
  }
  pthread_mutex_unlock(&callers_lock);
}

// The entry stores its time in the call's correlation slot; the exit adds the difference.
static void CUPTIAPI on_call(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId id,
                             const void *data) {
  (void)userdata;
  const CUpti_CallbackData *cb = data;
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API || id >= CALLS) return;
  if (cb->callbackSite == CUPTI_API_ENTER) {
    *cb->correlationData = now_ns();
    return;
  }
  const uint64_t began = *cb->correlationData, dt = now_ns() - began;
  if (began < start_ns + skip_ns) return;
  ThreadStats *s = this_thread();
  s->count[id]++;
  s->total_ns[id] += dt;
  if (dt > s->max_ns[id]) s->max_ns[id] = dt;
  if (is_launch(id)) s->launches++;
  if (!names[id]) names[id] = cb->functionName;
  if (is_watched(id)) count_caller(id, dt);
}

static void print_callers(void) {
  pthread_mutex_lock(&callers_lock);
  if (ncallers) fprintf(stderr, "who made the memory and stream calls (all threads):\n");
  for (int k = 0; k < ncallers; k++)
    fprintf(stderr, "  %-28s %8llu %10.2f ms  %s\n",
            names[callers[k].id] ? names[callers[k].id] : "?", (unsigned long long)callers[k].count,
            (double)callers[k].total_ns * 1e-6, callers[k].where);
  if (callers_dropped)
    fprintf(stderr, "  (%llu calls from callers beyond the first %d not shown)\n",
            (unsigned long long)callers_dropped, CALLERS);
  pthread_mutex_unlock(&callers_lock);
}

// The TOP functions of one set of sums by total time.
static void print_table(const char *title, const ThreadStats *s, int nthreads) {
  fprintf(stderr, "%s (%d thread%s):\n", title, nthreads, nthreads == 1 ? "" : "s");
  fprintf(stderr, "  %-36s %10s %12s %10s %10s\n", "driver function", "calls", "total ms",
          "mean us", "max ms");
  bool shown[CALLS] = {false};
  for (int row = 0; row < TOP; row++) {
    int best = -1;
    for (int id = 0; id < CALLS; id++)
      if (!shown[id] && s->count[id] && (best < 0 || s->total_ns[id] > s->total_ns[best]))
        best = id;
    if (best < 0) break;
    shown[best] = true;
    fprintf(stderr, "  %-36s %10llu %12.2f %10.2f %10.3f\n", names[best] ? names[best] : "?",
            (unsigned long long)s->count[best], (double)s->total_ns[best] * 1e-6,
            (double)s->total_ns[best] * 1e-3 / (double)s->count[best],
            (double)s->max_ns[best] * 1e-6);
  }
}

static void report(void) {
  cuptiUnsubscribe(subscriber);  // no more sums while they are read
  pthread_mutex_lock(&threads_lock);
  const ThreadStats *trainer = NULL;
  int n = 0;
  for (const ThreadStats *t = threads; t; t = t->next, n++)
    if (!trainer || t->launches > trainer->launches) trainer = t;
  ThreadStats *others = trainer ? calloc(1, sizeof *others) : NULL;
  if (!others) {
    pthread_mutex_unlock(&threads_lock);
    if (trainer)
      fprintf(stderr, "cuda_api_trace: out of memory\n");
    else
      fprintf(stderr,
              "cuda_api_trace: no driver call counted over %.1f s\n"
              "HINT: the process ended before CUDA_API_TRACE_SKIP_S (%.1f s) had passed; lower "
              "it\n",
              (double)(now_ns() - start_ns) * 1e-9, (double)skip_ns * 1e-9);
    return;
  }
  for (const ThreadStats *t = threads; t; t = t->next) {
    if (t == trainer) continue;
    for (int id = 0; id < CALLS; id++) {
      others->count[id] += t->count[id];
      others->total_ns[id] += t->total_ns[id];
      if (t->max_ns[id] > others->max_ns[id]) others->max_ns[id] = t->max_ns[id];
    }
  }
  fprintf(stderr, "cuda_api_trace: driver calls over %.1f s (the first %.1f s not counted)\n",
          (double)(now_ns() - start_ns) * 1e-9, (double)skip_ns * 1e-9);
  print_table("the thread that launched the most work", trainer, 1);
  if (n > 1) print_table("every other thread, summed", others, n - 1);
  pthread_mutex_unlock(&threads_lock);
  free(others);
  print_callers();
}

__attribute__((visibility("default"))) int InitializeInjection(void) {
  start_ns = now_ns();
  const char *skip = getenv("CUDA_API_TRACE_SKIP_S");
  if (skip) skip_ns = (uint64_t)(atof(skip) * 1e9);
  CUptiResult rc = cuptiSubscribe(&subscriber, (CUpti_CallbackFunc)on_call, NULL);
  if (rc == CUPTI_SUCCESS) rc = cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API);
  if (rc != CUPTI_SUCCESS) {
    const char *msg = NULL;
    cuptiGetResultString(rc, &msg);
    fprintf(stderr, "cuda_api_trace: CUPTI refused the subscription: %s\n", msg ? msg : "?");
    return 0;
  }
  atexit(report);
  return 1;
}
