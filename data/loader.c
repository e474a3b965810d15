// loader.c: the threaded batch loader: worker threads fill a ring of batch buffers ahead of the
// trainer, and batches come out strictly in order.
//
// Batches are numbered by a sequence s = 0, 1, 2, ... from the resume position; batch s lives in
// slot s % prefetch. A worker claims the next unclaimed s once its slot is free, copies that
// batch's sample indices out of the epoch's permutation (under the lock), then decodes and
// transforms without the lock. Each sample's pixels depend only on (seed, epoch, sample index),
// so the output never depends on how many workers there are or which one ran first.
//
// With gpu_decode each worker owns an nvJPEG decoder (data/jpeg_gpu.h) and each slot a device
// batch: the worker reads its batch's files, has nvJPEG parse their headers, draws each taken
// sample's geometry (its TransformPlan) and colour steps (kernels/image_aug.h) from the sample's
// own counter-based draws, as the stb path draws them, and the decoder decodes, crops, resizes,
// flips and colours the batch on the GPU into the slot's device batch. The bytes are those of
// the stb path's transform on nvJPEG's pixels. The rest (PNGs, progressive JPEGs, damaged files)
// take the stb path itself and are uploaded into their places.
#define _GNU_SOURCE  // sched_getaffinity, CPU_COUNT
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/dataset.h"
#include "data/jpeg_gpu.h"
#include "data/loader.h"
#include "data/transform.h"
#include "src/base/rng.h"

typedef enum {
  SLOT_FREE,     // may be claimed for the next sequence number that maps to it
  SLOT_FILLING,  // a worker is loading batch `seq`
  SLOT_READY,    // batch `seq` is complete
  SLOT_FAILED,   // batch `seq` failed; err says why
  SLOT_HELD,     // returned by loader_next, not yet released
} SlotState;

typedef struct {
  Batch batch;  // with gpu_decode, batch.device_pixels is the decoder's destination
  SlotState state;
  int64_t seq;
  int64_t *samples;  // (batch_size) dataset indices of batch `seq`
  Error err;
} Slot;

// What one worker thread owns: its GPU decoder (gpu_decode) and that decoder's per-batch lists.
typedef struct {
  Loader *loader;
  JpegGpu *jpeg;           // NULL: stb only
  uint8_t **files;         // (batch_size) the batch's files as read, NULL where there is none
  size_t *file_sizes;      // (batch_size)
  JpegGpuImage *images;    // (batch_size) what nvJPEG decoded
  TransformPlan *plans;    // (batch_size) the geometry of the samples nvJPEG takes
  Rng *rngs;               // (batch_size) their draws, where the colour part continues
  ImageAugStep *drawn;     // (batch_size, IMAGE_AUG_MAX_STEPS) their colour steps as drawn
  ImageAugStep *steps;     // (batch_size, nsteps) the same, nsteps = the batch's longest list
  LoaderStageTimes times;  // this worker's batch in progress (added to the loader's when done)
} Worker;

struct Loader {
  const Dataset *ds;
  LoaderOptions opt;
  int64_t n;             // dataset samples
  int64_t per_epoch;     // batches per epoch
  int64_t global_batch;  // batch_size * world samples per step
  int64_t first_batch;   // train: global batch number (epoch * per_epoch + index) of seq 0;
                         // eval: batch index of seq 0
  int64_t total;         // sequence numbers to produce (train: unbounded)
  size_t sample_bytes;
  Slot *slots;         // (prefetch)
  pthread_t *threads;  // (workers)
  Worker *workers;     // (workers)
  int threads_started;

  pthread_mutex_t mu;  // guards everything below and every slot's state
  pthread_cond_t slot_freed, batch_done;
  int64_t next_claim;  // next sequence number a worker takes
  int64_t next_out;    // next sequence number loader_next returns
  bool stop;
  int64_t *perm;  // (n) train: the shuffle of epoch perm_epoch (the newest claimed)
  int64_t perm_epoch;
  LoaderStageTimes times;  // of the finished batches
};

LoaderSizing loader_sizing(int workers_key, int prefetch_key, int cores, int online,
                           int local_world) {
  LoaderSizing s = {.workers = workers_key, .prefetch = prefetch_key};
  int share = online / (local_world > 0 ? local_world : 1);
  s.cores = cores < share ? cores : share;
  if (s.cores < 1) s.cores = 1;
  if (workers_key <= 0) {
    s.auto_workers = true;
    s.workers = s.cores > 1 ? s.cores - 1 : 1;
  }
  if (prefetch_key <= 0) {
    s.auto_prefetch = true;
    s.prefetch = s.workers + 2;
  }
  return s;
}

int loader_process_cores(int *online) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  *online = n > 0 ? (int)n : 1;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return *online;
  int mine = CPU_COUNT(&set);
  return mine > 0 ? mine : *online;
}

void loader_sizing_describe(const LoaderSizing *s, char *buf, size_t size) {
  char why[96] = "data.workers";
  if (s->auto_workers)
    snprintf(why, sizeof why, "auto: %d core%s for this process%s", s->cores,
             s->cores == 1 ? "" : "s", s->cores > 1 ? ", one for the trainer's thread" : "");
  snprintf(buf, size, "%d worker%s (%s), a ring of %d batches (%s)", s->workers,
           s->workers == 1 ? "" : "s", why, s->prefetch,
           s->auto_prefetch ? "auto: workers + 2" : "data.prefetch");
}

static void *buffer_alloc(const LoaderOptions *opt, size_t bytes) {
  return opt->alloc ? opt->alloc(bytes) : malloc(bytes);
}

static void buffer_release(const LoaderOptions *opt, void *ptr) {
  if (!ptr) return;
  if (opt->release)
    opt->release(ptr);
  else
    free(ptr);
}

// Fisher-Yates over [0, n) with draws from (seed, SHUFFLE, epoch, 0).
static void shuffle(int64_t *perm, int64_t n, uint64_t seed, int64_t epoch) {
  for (int64_t i = 0; i < n; i++) perm[i] = i;
  Rng rng = rng_make(seed, RNG_STREAM_SHUFFLE, (uint64_t)epoch, 0);
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = rng_below(&rng, (uint32_t)(i + 1));
    int64_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
}

// Under the lock: takes sequence number s into slot sl (epoch, index, count, sample indices).
static void claim(Loader *L, Slot *sl, int64_t s) {
  const LoaderOptions *o = &L->opt;
  int64_t g = L->first_batch + s;
  sl->state = SLOT_FILLING;
  sl->seq = s;
  sl->batch.epoch = o->train ? g / L->per_epoch : o->start_epoch;
  sl->batch.index = o->train ? g % L->per_epoch : g;
  // Rank r takes the contiguous slice [r*B, (r+1)*B) of the global batch; on a stream (tar
  // shards) it takes [k*B, (k+1)*B) of its own order instead.
  bool stream = o->train && dataset_is_stream(L->ds);
  int64_t base = stream ? sl->batch.index * o->batch_size
                        : sl->batch.index * L->global_batch + (int64_t)o->rank * o->batch_size;
  int64_t count = L->n - base;
  if (count > o->batch_size) count = o->batch_size;
  if (count < 0) count = 0;  // eval's last batch may leave a rank nothing
  sl->batch.count = (int)count;
  if (o->train) {
    // Claims are in order, so epochs never go back and one cached permutation suffices; the
    // indices are copied, so a worker never reads a permutation that is being replaced.
    if (L->perm_epoch != sl->batch.epoch) {
      if (stream)
        dataset_stream_order(L->ds, o->seed, sl->batch.epoch, o->rank, o->world, L->perm);
      else
        shuffle(L->perm, L->n, o->seed, sl->batch.epoch);
      L->perm_epoch = sl->batch.epoch;
    }
    for (int64_t j = 0; j < count; j++) sl->samples[j] = L->perm[base + j];
  } else {
    for (int64_t j = 0; j < count; j++) sl->samples[j] = base + j;
  }
}

// Without the lock: decodes and transforms the claimed samples into the slot's buffers.
static int fill(Loader *L, Slot *sl, LoaderStageTimes *times) {
  Batch *b = &sl->batch;
  for (int j = 0; j < b->count; j++) {
    if (dataset_load_sample_timed(L->ds, sl->samples[j], L->opt.train, L->opt.seed, b->epoch,
                                  b->pixels + (size_t)j * L->sample_bytes, &b->labels[j], times,
                                  &sl->err)) {
      return error_prefix(&sl->err, "loader: batch %lld of epoch %lld: ", (long long)b->index,
                          (long long)b->epoch);
    }
  }
  return 0;
}

// fill with the GPU decoder. The worker reads the batch's files, nvJPEG parses their headers,
// and the worker draws each taken sample's plan and colour steps from the sample's own draws
// (the CPU path's, in its order); the decoder then decodes, crops, resizes, flips and colours
// the batch on the GPU, straight into the slot's device batch. Meanwhile a sample nvJPEG left
// alone goes through dataset_load_sample (stb) into the host batch and is uploaded into its
// place. Without device_batch the finished batch comes back to the host batch.
static int fill_gpu(Loader *L, Slot *sl, Worker *wk) {
  Batch *b = &sl->batch;
  const LoaderOptions *o = &L->opt;
  size_t sb = L->sample_bytes;
  double t0 = time_now_s(), t1;
  for (int j = 0; j < b->count; j++)
    wk->files[j] = dataset_sample_file(L->ds, sl->samples[j], &wk->file_sizes[j]);
  t1 = time_now_s();
  wk->times.seconds[LOADER_READ] += t1 - t0;
  int rc = jpeg_gpu_parse(wk->jpeg, (const uint8_t *const *)wk->files, wk->file_sizes, b->count,
                          wk->images, &sl->err);
  int nsteps = 0, taken = 0;
  for (int j = 0; j < b->count && rc == 0; j++) {
    ImageAugStep *drawn = wk->drawn + (size_t)j * IMAGE_AUG_MAX_STEPS;
    int count = 0;
    if (wk->images[j].h > 0) {
      taken++;
      rc = dataset_plan_sample(L->ds, sl->samples[j], o->train, o->seed, b->epoch, wk->images[j].h,
                               wk->images[j].w, &wk->plans[j], &wk->rngs[j], &sl->err);
      if (rc == 0)
        rc = dataset_plan_colour(L->ds, sl->samples[j], o->train, &wk->rngs[j], drawn,
                                 IMAGE_AUG_MAX_STEPS, &count, &b->labels[j], &sl->err);
    }
    for (int k = count; k < IMAGE_AUG_MAX_STEPS; k++) drawn[k] = (ImageAugStep){0};
    if (count > nsteps) nsteps = count;
  }
  // The steps in a table as wide as the longest list, IMAGE_AUG_NONE (0) padding the others.
  for (int j = 0; j < b->count && rc == 0; j++)
    memcpy(wk->steps + (size_t)j * nsteps, wk->drawn + (size_t)j * IMAGE_AUG_MAX_STEPS,
           sizeof(ImageAugStep) * (size_t)nsteps);
  double t2 = time_now_s();
  wk->times.seconds[LOADER_PARSE] += t2 - t1;
  if (rc == 0)
    rc = jpeg_gpu_decode_into(wk->jpeg, wk->plans, wk->steps, nsteps, dataset_colour_fill(L->ds),
                              b->device_pixels, (int64_t)sb, wk->images, &sl->err);
  for (int j = 0; j < b->count && rc == 0; j++) {
    if (wk->images[j].pixels) continue;
    uint8_t *pixels = b->pixels + j * sb;
    rc = dataset_load_sample_timed(L->ds, sl->samples[j], o->train, o->seed, b->epoch, pixels,
                                   &b->labels[j], &wk->times, &sl->err);
    if (rc == 0) rc = jpeg_gpu_upload(wk->jpeg, b->device_pixels + j * sb, pixels, sb, &sl->err);
  }
  if (rc == 0 && !o->device_batch)
    rc = jpeg_gpu_download(wk->jpeg, b->pixels, b->device_pixels, (size_t)b->count * sb, &sl->err);
  JpegGpuTimes gpu = {0};
  if (rc == 0) rc = jpeg_gpu_finish(wk->jpeg, &gpu, &sl->err);
  wk->times.seconds[LOADER_DECODE] += gpu.decode;
  wk->times.seconds[LOADER_GEOMETRIC] += gpu.geometric;
  wk->times.seconds[LOADER_COLOUR] += gpu.colour;
  wk->times.seconds[LOADER_UPLOAD] += gpu.upload;
  wk->times.images += taken;
  for (int j = 0; j < b->count; j++) {
    free(wk->files[j]);
    wk->files[j] = NULL;
  }
  if (rc != 0)
    return error_prefix(&sl->err, "loader: batch %lld of epoch %lld: ", (long long)b->index,
                        (long long)b->epoch);
  return 0;
}

static void *worker_main(void *arg) {
  Worker *wk = arg;
  Loader *L = wk->loader;
  pthread_mutex_lock(&L->mu);
  for (;;) {
    if (L->stop || L->next_claim >= L->total) break;
    int64_t s = L->next_claim;
    Slot *sl = &L->slots[s % L->opt.prefetch];
    if (sl->state != SLOT_FREE) {
      pthread_cond_wait(&L->slot_freed, &L->mu);
      continue;
    }
    L->next_claim++;
    claim(L, sl, s);
    pthread_mutex_unlock(&L->mu);
    memset(&wk->times, 0, sizeof wk->times);
    int rc = wk->jpeg ? fill_gpu(L, sl, wk) : fill(L, sl, &wk->times);
    pthread_mutex_lock(&L->mu);
    for (int k = 0; k < LOADER_STAGES; k++) L->times.seconds[k] += wk->times.seconds[k];
    L->times.images += wk->times.images;
    sl->state = rc == 0 ? SLOT_READY : SLOT_FAILED;
    pthread_cond_broadcast(&L->batch_done);
  }
  pthread_mutex_unlock(&L->mu);
  return NULL;
}

int loader_create(Loader **out, const Dataset *ds, const LoaderOptions *opt, Error *err) {
  *out = NULL;
  if (opt->batch_size < 1) {
    return error_set(err, "loader: batch size %d must be >= 1\nHINT: set train.batch_size",
                     opt->batch_size);
  }
  if (opt->workers < 1 || opt->prefetch < 1) {
    return error_set(err,
                     "loader: data.workers = %d and data.prefetch = %d must both be >= 1\n"
                     "HINT: e.g. data.workers=2 data.prefetch=4",
                     opt->workers, opt->prefetch);
  }
  if (opt->world < 1 || opt->rank < 0 || opt->rank >= opt->world) {
    return error_set(err, "loader: rank %d is outside a world of %d", opt->rank, opt->world);
  }
  if (opt->start_epoch < 0 || opt->start_batch < 0) {
    return error_set(err, "loader: resume position epoch %lld batch %lld is negative",
                     (long long)opt->start_epoch, (long long)opt->start_batch);
  }
  int64_t n = dataset_size(ds), global_batch = (int64_t)opt->batch_size * opt->world;
  int64_t per_epoch = opt->train ? n / global_batch : (n + global_batch - 1) / global_batch;
  bool stream = opt->train && dataset_is_stream(ds);
  if (stream) {
    // Each rank streams its own shards; all make as many steps as the smallest share allows.
    int64_t fewest = INT64_MAX;
    for (int r = 0; r < opt->world; r++) {
      int64_t mine = dataset_stream_samples(ds, r, opt->world);
      fewest = mine < fewest ? mine : fewest;
    }
    per_epoch = fewest / opt->batch_size;
    if (per_epoch == 0)
      return error_set(err,
                       "loader: %s: rank r streams the tar files r, r + %d, ...; the smallest "
                       "share holds %lld samples, fewer than one batch of %d\n"
                       "HINT: write more, smaller shards (at least one per rank) or lower "
                       "train.batch_size",
                       dataset_describe(ds), opt->world, (long long)fewest, opt->batch_size);
  }
  if (per_epoch == 0) {
    return error_set(err,
                     "loader: %s holds fewer samples than one batch of %d x %d ranks; training "
                     "drops partial batches, so an epoch would be empty\n"
                     "HINT: lower train.batch_size or raise data.train_limit",
                     dataset_describe(ds), opt->batch_size, opt->world);
  }

  Loader *L = calloc_check(1, sizeof *L);
  L->ds = ds;
  L->opt = *opt;
  L->n = n;
  L->global_batch = global_batch;
  L->per_epoch = per_epoch;
  L->sample_bytes = (size_t)dataset_sample_bytes(ds);
  if (opt->train) {
    L->first_batch = opt->start_epoch * per_epoch + opt->start_batch;
    L->total = INT64_MAX;
    L->perm = malloc_check(sizeof(int64_t) * (size_t)n);
    L->perm_epoch = -1;
  } else {
    L->first_batch = opt->start_batch;
    L->total = opt->start_batch < per_epoch ? per_epoch - opt->start_batch : 0;
  }
  pthread_mutex_init(&L->mu, NULL);
  pthread_cond_init(&L->slot_freed, NULL);
  pthread_cond_init(&L->batch_done, NULL);

  L->slots = calloc_check((size_t)opt->prefetch, sizeof(Slot));
  size_t pixel_bytes = L->sample_bytes * (size_t)opt->batch_size;
  size_t label_bytes = sizeof(int) * (size_t)opt->batch_size;
  for (int i = 0; i < opt->prefetch; i++) {
    Slot *sl = &L->slots[i];
    sl->state = SLOT_FREE;
    sl->samples = malloc_check(sizeof(int64_t) * (size_t)opt->batch_size);
    sl->batch.samples = sl->samples;
    sl->batch.pixels = buffer_alloc(opt, pixel_bytes);
    sl->batch.labels = buffer_alloc(opt, label_bytes);
    if (!sl->batch.pixels || !sl->batch.labels) {
      error_set(err,
                "loader: cannot allocate %d batch buffers of %zu bytes\n"
                "HINT: lower data.prefetch or train.batch_size",
                opt->prefetch, pixel_bytes + label_bytes);
      loader_destroy(L);
      return -1;
    }
  }
  L->workers = calloc_check((size_t)opt->workers, sizeof(Worker));
  bool gpu_decode = opt->gpu_decode && dataset_has_files(ds);
  for (int i = 0; i < opt->workers; i++) {
    Worker *wk = &L->workers[i];
    wk->loader = L;
    if (!gpu_decode) continue;
    // Created here, on the caller's thread and CUDA device, so a failure is loader_create's.
    if (jpeg_gpu_create(&wk->jpeg, opt->batch_size, dataset_channels(ds), err) != 0) {
      error_prefix(err, "loader: worker %d of %d: ", i + 1, opt->workers);
      loader_destroy(L);
      return -1;
    }
    wk->files = calloc_check((size_t)opt->batch_size, sizeof *wk->files);
    wk->file_sizes = calloc_check((size_t)opt->batch_size, sizeof *wk->file_sizes);
    wk->images = calloc_check((size_t)opt->batch_size, sizeof *wk->images);
    wk->plans = calloc_check((size_t)opt->batch_size, sizeof *wk->plans);
    wk->rngs = calloc_check((size_t)opt->batch_size, sizeof *wk->rngs);
    wk->drawn = calloc_check((size_t)opt->batch_size * IMAGE_AUG_MAX_STEPS, sizeof *wk->drawn);
    wk->steps = calloc_check((size_t)opt->batch_size * IMAGE_AUG_MAX_STEPS, sizeof *wk->steps);
  }
  for (int i = 0; i < opt->prefetch && gpu_decode; i++) {
    // The decoder's destination (data/jpeg_gpu.h); with device_batch, the batch itself.
    L->slots[i].batch.device_pixels = jpeg_gpu_device_alloc(pixel_bytes);
    if (!L->slots[i].batch.device_pixels) {
      error_set(err,
                "loader: cannot allocate %d device batch buffers of %zu bytes on the GPU\n"
                "HINT: lower data.prefetch or train.batch_size, or set data.decoder=stb",
                opt->prefetch, pixel_bytes);
      loader_destroy(L);
      return -1;
    }
  }
  L->threads = calloc_check((size_t)opt->workers, sizeof(pthread_t));
  for (int i = 0; i < opt->workers; i++) {
    int rc = pthread_create(&L->threads[i], NULL, worker_main, &L->workers[i]);
    if (rc != 0) {
      error_set(err, "loader: cannot start worker thread %d of %d: %s\nHINT: lower data.workers",
                i + 1, opt->workers, strerror(rc));
      loader_destroy(L);
      return -1;
    }
    L->threads_started++;
  }
  *out = L;
  return 0;
}

int64_t loader_batches_per_epoch(const Loader *L) {
  return L->per_epoch;
}

const char *loader_decoder(const Loader *L) {
  const JpegGpu *d = L->opt.workers > 0 ? L->workers[0].jpeg : NULL;
  if (!d) return "stb";
  return strcmp(jpeg_gpu_backend(d), "hardware") == 0 ? "nvjpeg, hardware backend"
                                                      : "nvjpeg, gpu backend";
}

void loader_stage_times(Loader *L, LoaderStageTimes *times) {
  pthread_mutex_lock(&L->mu);
  *times = L->times;
  pthread_mutex_unlock(&L->mu);
}

int loader_next(Loader *L, Batch **batch, Error *err) {
  *batch = NULL;
  pthread_mutex_lock(&L->mu);
  if (L->next_out >= L->total) {
    pthread_mutex_unlock(&L->mu);
    return 0;
  }
  Slot *sl = &L->slots[L->next_out % L->opt.prefetch];
  // The slot still holds an earlier batch the caller has not released: no worker can fill it.
  if (sl->state == SLOT_HELD) {
    pthread_mutex_unlock(&L->mu);
    return error_set(err,
                     "loader_next: all %d prefetch buffers are held by the caller\n"
                     "HINT: call loader_release_batch on a batch before asking for more than "
                     "data.prefetch of them",
                     L->opt.prefetch);
  }
  while (sl->seq != L->next_out || (sl->state != SLOT_READY && sl->state != SLOT_FAILED)) {
    pthread_cond_wait(&L->batch_done, &L->mu);
  }
  int rc = 0;
  if (sl->state == SLOT_FAILED) {
    // The slot stays failed, so every later call reports the same error.
    rc = error_set(err, "%s", sl->err.msg);
  } else {
    sl->state = SLOT_HELD;
    L->next_out++;
    *batch = &sl->batch;
  }
  pthread_mutex_unlock(&L->mu);
  return rc;
}

void loader_release_batch(Loader *L, Batch *batch) {
  if (!batch) return;
  pthread_mutex_lock(&L->mu);
  for (int i = 0; i < L->opt.prefetch; i++) {
    Slot *sl = &L->slots[i];
    if (&sl->batch == batch && sl->state == SLOT_HELD) {
      sl->state = SLOT_FREE;
      pthread_cond_broadcast(&L->slot_freed);
    }
  }
  pthread_mutex_unlock(&L->mu);
}

void loader_destroy(Loader *L) {
  if (!L) return;
  pthread_mutex_lock(&L->mu);
  L->stop = true;
  pthread_cond_broadcast(&L->slot_freed);
  pthread_mutex_unlock(&L->mu);
  // A worker in the middle of a batch finishes it (milliseconds), then sees stop.
  for (int i = 0; i < L->threads_started; i++) pthread_join(L->threads[i], NULL);
  for (int i = 0; L->slots && i < L->opt.prefetch; i++) {
    buffer_release(&L->opt, L->slots[i].batch.pixels);
    buffer_release(&L->opt, L->slots[i].batch.labels);
    jpeg_gpu_device_free(L->slots[i].batch.device_pixels);
    free(L->slots[i].samples);
  }
  free(L->slots);
  for (int i = 0; L->workers && i < L->opt.workers; i++) {
    jpeg_gpu_destroy(L->workers[i].jpeg);
    free(L->workers[i].files);
    free(L->workers[i].file_sizes);
    free(L->workers[i].images);
    free(L->workers[i].plans);
    free(L->workers[i].rngs);
    free(L->workers[i].drawn);
    free(L->workers[i].steps);
  }
  free(L->workers);
  free(L->threads);
  free(L->perm);
  pthread_cond_destroy(&L->slot_freed);
  pthread_cond_destroy(&L->batch_done);
  pthread_mutex_destroy(&L->mu);
  free(L);
}
