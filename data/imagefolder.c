// imagefolder.c: the ImageFolder dataset's scan: <data.path>/<split>/<class>/*.{jpg,jpeg,png}
// into a file list sorted by class name, then file name (strcmp), with the class index as
// label; a split limit taken round-robin over the classes. Only the list (and the class names) is
// kept: each image is read and decoded when it is loaded (data/file_samples.c). The listing of
// one directory's images is also dataset_list_images, swin_predict's.
#define _POSIX_C_SOURCE 200809L  // stat (data/dataset_internal.h)
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "data/dataset_internal.h"

typedef struct {
  char **items;
  int count, cap;
} NameList;

static void names_push(NameList *l, const char *s) {
  if (l->count == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 64;
    char **grown = malloc_check(sizeof(char *) * (size_t)l->cap);
    if (l->count) memcpy(grown, l->items, sizeof(char *) * (size_t)l->count);
    free(l->items);
    l->items = grown;
  }
  size_t len = strlen(s) + 1;
  l->items[l->count] = malloc_check(len);
  memcpy(l->items[l->count++], s, len);
}

static void names_free(NameList *l) {
  for (int i = 0; i < l->count; i++) free(l->items[i]);
  free(l->items);
  *l = (NameList){0};
}

static int compare_names(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static bool is_image_name(const char *name) {
  const char *dot = strrchr(name, '.');
  if (!dot || dot == name) return false;
  return strcasecmp(dot, ".jpg") == 0 || strcasecmp(dot, ".jpeg") == 0 ||
         strcasecmp(dot, ".png") == 0;
}

// Lists dir's subdirectories (want_dirs) or image files, sorted with strcmp; hidden entries
// (starting with '.') are skipped.
static int list_dir(const char *dir, bool want_dirs, NameList *out, Error *err) {
  DIR *d = opendir(dir);
  if (!d) return error_set(err, "cannot list directory '%s': %s", dir, strerror(errno));
  struct dirent *e;
  char path[PATH_BYTES];
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    if (join_path(path, dir, e->d_name, err)) {
      closedir(d);
      return -1;
    }
    // stat rather than d_type: some filesystems report DT_UNKNOWN, and links should count.
    if (want_dirs ? is_dir(path) : (is_image_name(e->d_name) && is_file(path))) {
      names_push(out, e->d_name);
    }
  }
  closedir(d);
  if (out->count > 1) qsort(out->items, (size_t)out->count, sizeof(char *), compare_names);
  return 0;
}

int dataset_list_images(const char *dir, char ***paths, int *count, Error *err) {
  NameList names = {0};
  *paths = NULL;
  *count = 0;
  if (list_dir(dir, false, &names, err)) {
    names_free(&names);
    return -1;
  }
  char **out = malloc_check(sizeof(char *) * (size_t)(names.count ? names.count : 1));
  for (int i = 0; i < names.count; i++) {
    char path[PATH_BYTES];
    if (join_path(path, dir, names.items[i], err)) {
      dataset_paths_free(out, i);
      names_free(&names);
      return -1;
    }
    size_t len = strlen(path) + 1;
    out[i] = memcpy(malloc_check(len), path, len);
  }
  *paths = out;
  *count = names.count;
  names_free(&names);
  return 0;
}

void dataset_paths_free(char **paths, int count) {
  for (int i = 0; i < count; i++) free(paths[i]);
  free(paths);
}

static const char *HINT_IMAGEFOLDER =
    "HINT: an imagefolder dataset is <data.path>/train/<class>/*.{jpg,jpeg,png} and "
    "<data.path>/val/<class>/*.{jpg,jpeg,png}, the same class directory names in both";

// The val split must use the same class names as train, or labels would silently differ.
static int check_classes_match(const char *root, const NameList *val, Error *err) {
  char train_dir[PATH_BYTES];
  if (join_path(train_dir, root, "train", err)) return -1;
  if (!is_dir(train_dir)) {
    return error_set(err,
                     "imagefolder: the val split's labels come from the train split's class "
                     "list, but '%s' does not exist\n%s",
                     train_dir, HINT_IMAGEFOLDER);
  }
  NameList train = {0};
  if (list_dir(train_dir, true, &train, err)) return -1;
  int rc = 0;
  for (int i = 0; i < val->count && rc == 0; i++) {
    if (!bsearch(&val->items[i], train.items, (size_t)train.count, sizeof(char *), compare_names)) {
      rc = error_set(err, "imagefolder '%s': class '%s' is in val/ but not in train/\n%s", root,
                     val->items[i], HINT_IMAGEFOLDER);
    }
  }
  for (int i = 0; i < train.count && rc == 0; i++) {
    if (!bsearch(&train.items[i], val->items, (size_t)val->count, sizeof(char *), compare_names)) {
      rc = error_set(err, "imagefolder '%s': class '%s' is in train/ but not in val/\n%s", root,
                     train.items[i], HINT_IMAGEFOLDER);
    }
  }
  names_free(&train);
  return rc;
}

int imagefolder_open(Dataset *ds, const Config *cfg, const char *split, Error *err) {
  if (cfg->in_chans < 1 || cfg->in_chans > 4) {
    error_set(err,
              "model.in_chans = %d, but images decode to 1 (gray), 2 (gray+alpha), 3 (RGB) "
              "or 4 (RGBA) channels\nHINT: set model.in_chans=3",
              cfg->in_chans);
    return config_error_where(cfg, err);
  }
  char split_dir[PATH_BYTES];
  if (join_path(split_dir, cfg->path, split, err)) return -1;
  if (!is_dir(split_dir)) {
    return error_set(err, "imagefolder split directory '%s' does not exist\n%s", split_dir,
                     HINT_IMAGEFOLDER);
  }
  NameList classes = {0}, files = {0}, all = {0};
  int rc = -1;
  int *per_class = NULL, *take = NULL;
  if (list_dir(split_dir, true, &classes, err)) goto done;
  if (classes.count == 0) {
    error_set(err, "imagefolder split directory '%s' has no class directories\n%s", split_dir,
              HINT_IMAGEFOLDER);
    goto done;
  }
  if (strcmp(split, "val") == 0 && check_classes_match(cfg->path, &classes, err)) goto done;

  // All files, class by class, each class's files sorted.
  per_class = calloc_check((size_t)classes.count, sizeof(int));
  for (int c = 0; c < classes.count; c++) {
    char class_dir[PATH_BYTES], path[PATH_BYTES];
    if (join_path(class_dir, split_dir, classes.items[c], err)) goto done;
    if (list_dir(class_dir, false, &files, err)) goto done;
    if (files.count == 0) {
      error_set(err,
                "imagefolder class directory '%s' has no .jpg/.jpeg/.png images\n"
                "HINT: every subdirectory of '%s' is a class; add images or remove it",
                class_dir, split_dir);
      goto done;
    }
    for (int f = 0; f < files.count; f++) {
      if (join_path(path, class_dir, files.items[f], err)) goto done;
      names_push(&all, path);
    }
    per_class[c] = files.count;
    names_free(&files);
  }

  // A limit takes files round-robin over the classes (the first file of every class, then the
  // second, ...), so a quick run still sees every class; the kept files stay in sorted order.
  take = calloc_check((size_t)classes.count, sizeof(int));
  int limit = strcmp(split, "train") == 0 ? cfg->train_limit : cfg->val_limit;
  int64_t kept = all.count;
  if (limit > 0 && limit < all.count) {
    kept = 0;
    for (int round = 0; kept < limit; round++) {
      for (int c = 0; c < classes.count && kept < limit; c++) {
        if (round < per_class[c]) {
          take[c]++;
          kept++;
        }
      }
    }
  } else {
    memcpy(take, per_class, sizeof(int) * (size_t)classes.count);
  }
  ds->paths = malloc_check(sizeof(char *) * (size_t)kept);
  ds->class_of = malloc_check(sizeof(int) * (size_t)kept);
  int64_t n = 0, first = 0;
  for (int c = 0; c < classes.count; c++) {
    for (int f = 0; f < per_class[c]; f++) {
      char *path = all.items[first + f];
      all.items[first + f] = NULL;
      if (f < take[c]) {
        ds->paths[n] = path;
        ds->class_of[n++] = c;
      } else {
        free(path);
      }
    }
    first += per_class[c];
  }
  ds->n = n;
  ds->num_classes = classes.count;
  ds->class_names = classes.items;  // the dataset keeps the sorted names
  classes = (NameList){0};
  snprintf(ds->describe, sizeof ds->describe, "imagefolder %s (%s): %lld images, %d classes", split,
           split_dir, (long long)ds->n, ds->num_classes);
  rc = 0;
done:
  free(per_class);
  free(take);
  names_free(&classes);
  names_free(&files);
  names_free(&all);
  return rc;
}
