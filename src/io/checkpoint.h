// checkpoint.h: one self-describing safetensors file per checkpoint.
//
// Tensors: the fp32 master weights under their timm names, the AdamW moments under
// "optim.exp_avg.<name>" and "optim.exp_avg_sq.<name>", and, in a run with train.ema_decay, the
// moving average of the weights under "ema.<name>" (fp32, the weights' shapes). Metadata: format
// and version, the resolved config (INI text), the optimizer step, the data position (epoch and
// next batch), the seed that keys every counter-based random stream, the loss scaler (scale and
// clean steps), the count of skipped steps, the process count of the job that wrote it and, when
// the dataset names its classes, "class_names": the names joined with '\n' in class order (label 0
// first; an ImageFolder's directories), which swin_predict prints and swin_export carries on. The
// format is the same whatever device and precision wrote it. Files are named
// ckpt-<step>.safetensors in the run directory, written atomically (temp file, fsync, rename) with
// a checksum; the newest `keep` are kept.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "src/base/util.h"
#include "src/model/model.h"

#define CHECKPOINT_FORMAT "swin.c checkpoint"
#define CHECKPOINT_VERSION 1

typedef struct {
  int64_t step;          // optimizer steps completed
  int64_t epoch, batch;  // data position: the next batch the loader produces
  uint64_t seed;
  double loss_scale;         // the dynamic loss scale (fp16; 1 otherwise)
  int32_t scale_good_steps;  // clean steps since the scale last changed
  int64_t skipped;  // steps skipped for a non-finite gradient: AdamW's step is step - skipped
  int32_t world;    // processes of the job that wrote it (0 in checkpoints that do not say)
  bool has_ema;     // checkpoint_load: the file holds the weights' moving average ("ema.*")
} TrainState;

// Saves m's weights, the moments exp_avg / exp_avg_sq (num_floats each), the moving average ema
// (num_floats, NULL: none), state and class_names ('\n'-joined, NULL: none) into
// dir/ckpt-<step>.safetensors, then deletes all but the newest `keep` checkpoints. path (if not
// NULL) receives the file written. A NaN or infinity in any tensor is refused, naming it, and
// nothing is written; a failed write (disk full, file size limit, permissions) leaves the earlier
// checkpoints as they were and names the file and the cause.
int checkpoint_save(const char *dir, const Model *m, const float *exp_avg, const float *exp_avg_sq,
                    const float *ema, const TrainState *state, const char *class_names, int keep,
                    char *path, size_t path_size, Error *err);
// Loads a checkpoint into m (whose config must describe the same model), the moments and state;
// when the file holds a moving average, into ema (num_floats; NULL: not wanted, left in the
// file), and state->has_ema says whether it did. Nothing is modified unless the whole file is
// valid: checksum, config, every tensor's dtype and shape, finite values, non-negative second
// moments, step and data position, and either every "ema.*" tensor or none.
int checkpoint_load(const char *path, Model *m, float *exp_avg, float *exp_avg_sq, float *ema,
                    TrainState *state, Error *err);
// Lists dir's checkpoints, newest first; returns how many (0 if none or no dir). Each entry is a
// malloc'ed path; free with checkpoint_list_free.
int checkpoint_list(const char *dir, char ***paths);
void checkpoint_list_free(char **paths, int count);
// Removes the temp files (ckpt-<step>.safetensors.tmp) that a save killed mid-write leaves in
// dir; returns how many, or -1 with err. Only the process that holds dir's run lock may call it
// (another one could be writing such a file).
int checkpoint_remove_stale_temps(const char *dir, Error *err);
