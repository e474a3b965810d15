// file_samples.c: the samples of ImageFolder and shard datasets, whose images are JPEG/PNG
// files: read (a file, or a member of a tar shard) and decoded with stb_image (data/image.h) when
// loaded; with data.skip_bad, a file that does not decode flagged, named once and replaced; then
// the transform in its steps (plan, geometric, colour), which the loader's nvJPEG path runs
// apart: the draws here, the rest on the GPU.
#define _POSIX_C_SOURCE 200809L  // stat (data/dataset_internal.h)
#include <stdlib.h>
#include <string.h>

#include "data/dataset_internal.h"
#include "data/image.h"

// Sample i's file as read (malloc'ed, *size bytes), or NULL with err.
static uint8_t *read_sample_file(const Dataset *ds, int64_t i, size_t *size, Error *err) {
  return ds->kind == DATASET_SHARDS ? shards_read(&ds->shards, i, size, err)
                                    : read_file(ds->paths[i], size, err);
}

static int sample_label(const Dataset *ds, int64_t i) {
  return ds->kind == DATASET_SHARDS ? ds->shards.label[i] : ds->class_of[i];
}

// Where sample i's image lives, for messages: its file, or its shard and offset.
static void sample_where(const Dataset *ds, int64_t i, char *buf, size_t size) {
  if (ds->kind == DATASET_SHARDS)
    snprintf(buf, size, "%s, bytes %lld..", ds->shards.paths[ds->shards.shard[i]],
             (long long)ds->shards.offset[i]);
  else
    snprintf(buf, size, "%s", ds->paths[i]);
}

const char *const loader_stage_names[LOADER_STAGES] = {"read",      "parse",  "decode",
                                                       "geometric", "colour", "upload"};

// Adds the time since *t0 to stage s of times (when there are times) and moves *t0 to now.
static void stage_time(LoaderStageTimes *times, LoaderStage s, double *t0) {
  if (!times) return;
  double now = time_now_s();
  times->seconds[s] += now - *t0;
  *t0 = now;
}

// Decodes sample i's file to (h, w, transform.chans) pixels; NULL with why (a buffer of
// why_size) when it cannot be read or decoded, or is too large.
static uint8_t *decode_image(const Dataset *ds, int64_t i, int *h, int *w, char *why,
                             size_t why_size, LoaderStageTimes *times) {
  Error read_err;
  size_t size = 0;
  double t0 = times ? time_now_s() : 0;
  uint8_t *file = read_sample_file(ds, i, &size, &read_err);
  stage_time(times, LOADER_READ, &t0);
  if (!file) {
    snprintf(why, why_size, "%.*s", (int)why_size - 1, read_err.msg);
    return NULL;
  }
  uint8_t *img = image_decode(file, size, ds->transform.chans, h, w, why, why_size);
  free(file);
  stage_time(times, LOADER_DECODE, &t0);
  return img;
}

static bool is_known_bad(const Dataset *ds, int64_t i) {
  pthread_mutex_lock(ds->bad_lock);
  bool bad = ds->known_bad[i];
  pthread_mutex_unlock(ds->bad_lock);
  return bad;
}

// Flags sample i as bad; the first time, names it in the log (stderr) with the running count.
static void note_bad(const Dataset *ds, int64_t i, const char *why) {
  Dataset *mutable = (Dataset *)ds;  // the flags are a cache of facts about the files
  pthread_mutex_lock(ds->bad_lock);
  if (!ds->known_bad[i]) {
    mutable->known_bad[i] = 1;
    mutable->bad_count++;
    char where[PATH_BYTES + 64];
    sample_where(ds, i, where, sizeof where);
    fprintf(stderr,
            "warning: data.skip_bad: skipping '%s' (sample %lld), which does not decode: %s "
            "(bad images so far: %lld)\n",
            where, (long long)i, why, (long long)ds->bad_count);
  }
  pthread_mutex_unlock(ds->bad_lock);
}

// Decodes sample i. Without skip_bad a failure is an error naming the file; with it, a bad
// sample is replaced by the next one in split order (i+1, i+2, ..., wrapping) that decodes, so
// the replacement depends only on the files, never on threads or timing. *source gets the
// sample used.
static int load_image_or_next(const Dataset *ds, int64_t i, int64_t *source, uint8_t **img, int *h,
                              int *w, LoaderStageTimes *times, Error *err) {
  char why[512] = "each was found not to decode before";
  for (int64_t tries = 0, j = i; tries < ds->n; tries++, j = (j + 1) % ds->n) {
    if (ds->skip_bad && is_known_bad(ds, j)) continue;
    *img = decode_image(ds, j, h, w, why, sizeof why, times);
    if (*img) {
      *source = j;
      return 0;
    }
    if (!ds->skip_bad) {
      char where[PATH_BYTES + 64];
      sample_where(ds, j, where, sizeof where);
      return error_set(err,
                       "cannot decode image '%s' (sample %lld of %s): %s\n"
                       "HINT: the file is corrupt or not a JPEG/PNG; remove or replace it, or "
                       "set data.skip_bad=true to skip such files",
                       where, (long long)j, ds->describe, why);
    }
    note_bad(ds, j, why);
  }
  return error_set(err,
                   "data.skip_bad: no image of %s decodes (last reason: %s)\n"
                   "HINT: check data.path and the files",
                   ds->describe, why);
}

// A file image's transform in its three steps: the plan, drawn from rng (keyed by the sample
// asked for, so a replaced sample is as deterministic as any); the plan run on the decoded image
// (h, w, chans); the colour part, with the draws that follow the plan's, and the label of sample
// source. The loader's nvJPEG path runs them apart: the draws here (dataset_plan_sample,
// dataset_plan_colour), the plan and the colour steps on the GPU.
static TransformPlan plan_image(const Dataset *ds, int h, int w, bool train, Rng *rng) {
  return train ? transform_plan_train(&ds->transform, h, w, rng)
               : transform_plan_eval(&ds->transform, h, w);
}

static void finish_image(const Dataset *ds, int64_t source, bool train, Rng *rng, uint8_t *pixels,
                         int *label) {
  if (train) transform_train_color(&ds->transform, pixels, ds->transform.chans, rng);
  *label = sample_label(ds, source);
}

static void transform_image(const Dataset *ds, int64_t source, const uint8_t *img, int h, int w,
                            bool train, Rng *rng, uint8_t *pixels, int *label,
                            LoaderStageTimes *times) {
  double t0 = times ? time_now_s() : 0;
  TransformPlan plan = plan_image(ds, h, w, train, rng);
  transform_apply(&plan, img, ds->transform.chans, pixels);
  stage_time(times, LOADER_GEOMETRIC, &t0);
  finish_image(ds, source, train, rng, pixels, label);
  stage_time(times, LOADER_COLOUR, &t0);
}

int file_sample_load(const Dataset *ds, int64_t i, bool train, Rng *rng, uint8_t *pixels,
                     int *label, LoaderStageTimes *times, Error *err) {
  int64_t source = i;  // the sample whose image is used: i, or its replacement under skip_bad
  int w = 0, h = 0;
  uint8_t *img = NULL;
  if (load_image_or_next(ds, i, &source, &img, &h, &w, times, err) != 0) return -1;
  transform_image(ds, source, img, h, w, train, rng, pixels, label, times);
  if (times) times->images++;
  image_free(img);
  return 0;
}

int64_t dataset_bad_count(const Dataset *ds) {
  if (!ds->bad_lock) return 0;
  pthread_mutex_lock(ds->bad_lock);
  int64_t count = ds->bad_count;
  pthread_mutex_unlock(ds->bad_lock);
  return count;
}

uint8_t *dataset_sample_file(const Dataset *ds, int64_t i, size_t *size) {
  *size = 0;
  if (i < 0 || i >= ds->n || !dataset_has_files(ds)) return NULL;
  if (ds->skip_bad && is_known_bad(ds, i)) return NULL;
  Error read_err;
  return read_sample_file(ds, i, size, &read_err);
}

// Sample i with its own file decoded: the checks of the loader's decoded paths.
static int check_decoded(const Dataset *ds, int64_t i, Error *err) {
  if (i < 0 || i >= ds->n || !dataset_has_files(ds))
    return error_set(err, "%s: sample %lld has no image file to have been decoded", ds->describe,
                     (long long)i);
  return 0;
}

int dataset_load_decoded_sample(const Dataset *ds, int64_t i, bool train, uint64_t seed,
                                int64_t epoch, const uint8_t *img, int h, int w, uint8_t *pixels,
                                int *label, Error *err) {
  if (check_decoded(ds, i, err) != 0) return -1;
  Rng rng = rng_make(seed, RNG_STREAM_AUGMENT, (uint64_t)epoch, (uint64_t)i);
  transform_image(ds, i, img, h, w, train, &rng, pixels, label, NULL);
  return 0;
}

int dataset_plan_sample(const Dataset *ds, int64_t i, bool train, uint64_t seed, int64_t epoch,
                        int h, int w, TransformPlan *plan, Rng *rng, Error *err) {
  if (check_decoded(ds, i, err) != 0) return -1;
  *rng = rng_make(seed, RNG_STREAM_AUGMENT, (uint64_t)epoch, (uint64_t)i);
  *plan = plan_image(ds, h, w, train, rng);
  return 0;
}

int dataset_plan_colour(const Dataset *ds, int64_t i, bool train, Rng *rng, ImageAugStep *steps,
                        int max_steps, int *nsteps, int *label, Error *err) {
  if (check_decoded(ds, i, err) != 0) return -1;
  *nsteps = train ? transform_color_draw(&ds->transform, rng, steps, max_steps) : 0;
  *label = sample_label(ds, i);
  return 0;
}
