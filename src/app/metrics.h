// metrics.h: run_dir/metrics.jsonl, one JSON record per line, appended to across resumes.
//
// Every record is flushed when written and every failed write is an error naming the file and
// the cause (disk full, file size limit, I/O error): a run that cannot log stops instead of
// training on blind. A record cut short by a killed run is dropped when the file is next opened,
// so the following record starts on a line of its own. After a kill the steps between the last
// checkpoint and the kill are logged again by the resumed run; readers keep the last record of
// a step (scripts/plot_metrics.py does).
#pragma once
#include <stdio.h>

#include "src/base/util.h"

typedef struct {
  FILE *file;
  char path[1024];
} MetricsLog;

// Opens dir/metrics.jsonl for appending (creating it). log (if not NULL) is told when an
// incomplete last record was dropped.
int metrics_open(MetricsLog *metrics, const char *dir, FILE *log, Error *err);
// Appends one record: fmt and its arguments print one JSON object; the newline is added here.
// A log that was never opened (a zeroed MetricsLog: ranks other than 0) takes the record silently.
int metrics_write(MetricsLog *metrics, Error *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void metrics_close(MetricsLog *metrics);
