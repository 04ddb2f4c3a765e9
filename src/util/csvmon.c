/* DeepSpeed's csv_monitor layout: under output_path/job_name, one file per
 * event, named after the event with '/' and ' ' made '_' (".csv"), whose
 * first line this run is "step,<the event name's last part>" and then one
 * "step,value" line per event, each line ended "\r\n" as Python's csv
 * writer ends it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/util.h"
#include "util/fs-impl.h"

#define CSV_MAX_FILES 32

struct zn_csvmon {
    char dir[4096];
    char names[CSV_MAX_FILES][128];
    int n;
};

int zn_csvmon_open(zn_csvmon **out, const char *dir)
{
    *out = NULL;
    zn_csvmon *m = calloc(1, sizeof *m);
    if (!m)
        return zn_set_error(-ENOMEM, "csv_monitor: out of memory");
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    int rc = zn_fs_mkdir_p(dir, 0755);
    if (rc) {
        free(m);
        return zn_error_prefix(rc, "csv_monitor");
    }
    *out = m;
    return 0;
}

int zn_csvmon_event(zn_csvmon *m, const char *name, int64_t step, double value)
{
    if (!m)
        return 0;
    char file[128], path[4300];
    snprintf(file, sizeof file, "%s", name);
    for (char *p = file; *p; p++)
        if (*p == '/' || *p == ' ')
            *p = '_';
    snprintf(path, sizeof path, "%s/%s.csv", m->dir, file);
    int seen = 0;
    for (int i = 0; i < m->n && !seen; i++)
        seen = !strcmp(m->names[i], file);
    FILE *f = fopen(path, "a");
    if (!f)
        return zn_set_error(-errno, "csv_monitor: %s: %s", path, strerror(errno));
    if (!seen) {
        const char *last = strrchr(name, '/');
        fprintf(f, "step,%s\r\n", last ? last + 1 : name);
        if (m->n < CSV_MAX_FILES)
            snprintf(m->names[m->n++], sizeof m->names[0], "%s", file);
    }
    fprintf(f, "%lld,%.9g\r\n", (long long)step, value);
    if (fclose(f))
        return zn_set_error(-EIO, "csv_monitor: writing %s failed", path);
    return 0;
}

void zn_csvmon_close(zn_csvmon *m)
{
    free(m);
}
