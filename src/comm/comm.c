/* The communicator's lifetime: configuration from the environment, the
 * backend choice (single, mpi, tcp; nccl on a CUDA device), the device part,
 * the queries, destroy and abort. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm-impl.h"

/* ---- configuration -----------------------------------------------------------*/
static double env_seconds(const char *name, double dflt)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return dflt;
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v > 0) || !isfinite(v)) {
        zn_warn("%s=\"%s\" is not a positive number of seconds; using %.0f", name, s, dflt);
        return dflt;
    }
    return v;
}

zn_comm_config zn_comm_config_default(void)
{
    zn_comm_config c;
    memset(&c, 0, sizeof c);
    const char *b = getenv("ZINC_COMM_BACKEND");
    c.backend = b && *b ? b : "auto";
    c.timeout_s = env_seconds("ZINC_COMM_TIMEOUT", 300);
    c.connect_timeout_s = env_seconds("ZINC_COMM_CONNECT_TIMEOUT", 300);
    c.grace_s = 0;
    return c;
}

/* ---- single rank -------------------------------------------------------------*/
static const zn_comm_host_ops single_ops = {
    .name = "single",
};

/* ---- creation ---------------------------------------------------------------------*/
int zn_comm_rank(const zn_comm *c)
{
    return c ? c->rank : 0;
}

int zn_comm_size(const zn_comm *c)
{
    return c ? c->size : 1;
}

void zn_comm_get_info(const zn_comm *c, zn_comm_info *out)
{
    memset(out, 0, sizeof *out);
    if (!c)
        return;
    out->rank = c->rank;
    out->size = c->size;
    out->local_rank = c->li.local_rank;
    out->local_size = c->li.local_size;
    out->launcher = c->li.launcher;
    snprintf(out->host_backend, sizeof out->host_backend, "%s", c->ops->name);
    snprintf(out->dev_backend, sizeof out->dev_backend, "%s", c->dev_backend);
    snprintf(out->version, sizeof out->version, "%s", c->version);
    out->timeout_s = c->timeout_s;
    out->nccl = c->nccl != NULL;
    pthread_mutex_lock((pthread_mutex_t *)&c->lock);
    out->n_ops = c->seq;
    pthread_mutex_unlock((pthread_mutex_t *)&c->lock);
}

int zn_comm_create(zn_comm **out, const zn_comm_config *cfg_in)
{
    if (!out)
        return zn_set_error(ZN_EARG, "zn_comm_create: NULL output");
    *out = NULL;
    zn_comm_config cfg = cfg_in ? *cfg_in : zn_comm_config_default();
    const char *name = cfg.backend && *cfg.backend ? cfg.backend : "auto";
    if (!(cfg.timeout_s > 0) || !isfinite(cfg.timeout_s))
        return zn_set_error(ZN_ECONFIG, "comm: timeout %.3g s must be a positive number",
                            cfg.timeout_s);
    if (!(cfg.connect_timeout_s > 0) || !isfinite(cfg.connect_timeout_s))
        cfg.connect_timeout_s = 300;
    int want_nccl = !strcmp(name, "nccl");
    if (strcmp(name, "auto") && strcmp(name, "single") && strcmp(name, "mpi") &&
        strcmp(name, "tcp") && !want_nccl)
        return zn_set_error(ZN_ECONFIG, "comm: unknown backend \"%s\" (auto, single, mpi, "
                            "tcp, nccl)", name);

    zn_comm *c = calloc(1, sizeof *c);
    if (!c)
        return zn_set_error(-ENOMEM, "comm: out of memory");
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->ops = &single_ops;
    c->timeout_s = cfg.timeout_s;
    c->connect_timeout_s = cfg.connect_timeout_s;
    c->grace_s = cfg.grace_s > 0 ? cfg.grace_s
                 : fmin(5.0, fmax(0.5, cfg.timeout_s / 4));
    snprintf(c->dev_backend, sizeof c->dev_backend, "none");
    snprintf(c->version, sizeof c->version, "zinc %s", ZN_VERSION);
    int rc;
    if (cfg.launch)
        c->li = *cfg.launch;
    else if ((rc = zn_launch_detect(&c->li)))
        goto fail;
    if (c->li.world_size < 1 || c->li.rank < 0 || c->li.rank >= c->li.world_size) {
        rc = zn_set_error(ZN_ECONFIG, "comm: rank %d of world %d", c->li.rank,
                          c->li.world_size);
        goto fail;
    }
    c->rank = c->li.rank;
    c->size = c->li.world_size;

    if (c->size > 1) {
        /* Before the backend: its rendezvous already uses the failure protocol. */
        c->reports = calloc((size_t)c->size, sizeof *c->reports);
        c->dead = calloc((size_t)c->size, 1);
        c->departed = calloc((size_t)c->size, 1);
        if (!c->reports || !c->dead || !c->departed) {
            rc = zn_set_error(-ENOMEM, "comm: out of memory");
            goto fail;
        }
    }

    const char *host = name;
    if (!strcmp(name, "auto") || want_nccl) {
        int mpi_launch = c->li.launcher == ZN_LAUNCH_MPI || c->li.launcher == ZN_LAUNCH_SLURM;
        if (c->size == 1)
            host = "single";
        else if (mpi_launch && ZN_HAVE_MPI)
            host = "mpi";
        else if (c->li.master_addr[0] && c->li.master_port)
            host = "tcp";
        else if (mpi_launch) {
            rc = zn_set_error(ZN_EUNSUPPORTED, "comm: launched by %s with %d ranks, but zinc "
                              "is built without MPI; set MASTER_ADDR and MASTER_PORT to use "
                              "the TCP backend, or rebuild with -Dmpi=enabled",
                              zn_launcher_name(c->li.launcher), c->size);
            goto fail;
        } else {
            rc = zn_set_error(ZN_ECONFIG, "comm: world size %d without MASTER_ADDR/"
                              "MASTER_PORT", c->size);
            goto fail;
        }
    }
    if (!strcmp(host, "single")) {
        if (c->size != 1) {
            rc = zn_set_error(ZN_ECONFIG, "comm: backend \"single\" with world size %d",
                              c->size);
            goto fail;
        }
    } else if (!strcmp(host, "mpi")) {
#if ZN_HAVE_MPI
        if ((rc = zn_comm_mpi_create(c)))
            goto fail;
#else
        rc = zn_set_error(ZN_EUNSUPPORTED, "comm: backend \"mpi\": zinc is built without MPI");
        goto fail;
#endif
    } else {
        if ((rc = zn_comm_tcp_create(c)))
            goto fail;
    }
    if (c->size > 1) {
        if (!c->ops->start) {
            if ((rc = pthread_create(&c->worker, NULL, zn_comm_worker_main, c))) {
                rc = zn_set_error(-rc, "comm: pthread_create: %s", strerror(rc));
                goto fail;
            }
            c->worker_started = 1;
        }
    }

    c->want_nccl = want_nccl;
    if (cfg.dev) {
        if ((rc = zn_comm_attach_device(c, cfg.dev)))
            goto fail;
    } else if (want_nccl) {
        rc = zn_set_error(ZN_EUNSUPPORTED, "comm: backend \"nccl\" needs a device "
                          "(zn_comm_config.dev)");
        goto fail;
    }
    *out = c;
    return 0;
fail:
    zn_comm_destroy(c);
    return rc;
}

/* The device part: a dedicated stream on `dev`, NCCL when the device is CUDA
 * (collective: NCCL's init needs every rank). */
int zn_comm_attach_device(zn_comm *c, zn_dev *dev)
{
    if (!c || !dev)
        return zn_set_error(ZN_EARG, "zn_comm_attach_device: NULL %s", c ? "device" :
                            "communicator");
    if (c->dev)
        return zn_set_error(ZN_EARG, "zn_comm_attach_device: a device is attached already");
    int rc;
    c->dev = dev;
    if ((rc = zn_dev_stream_create_copy(c->dev, "comm", &c->stream))) {
        c->dev = NULL;
        return rc;
    }
    zn_dev_kind kind = zn_dev_get_kind(c->dev);
    if (kind == ZN_DEV_CUDA && (c->want_nccl || c->size > 1) && ZN_HAVE_NCCL) {
#if ZN_HAVE_NCCL
        if ((rc = zn_nccl_init(c))) {
            zn_comm_detach_device(c);
            return rc;
        }
        snprintf(c->dev_backend, sizeof c->dev_backend, "nccl");
#endif
    } else if (c->want_nccl) {
        rc = zn_set_error(ZN_EUNSUPPORTED, "comm: backend \"nccl\" needs a CUDA device "
                          "and zinc built with NCCL (device is %s, NCCL %s)",
                          kind == ZN_DEV_CUDA ? "CUDA" : "host",
                          ZN_HAVE_NCCL ? "built" : "not built");
        zn_comm_detach_device(c);
        return rc;
    } else if (c->size == 1) {
        snprintf(c->dev_backend, sizeof c->dev_backend, "copy");
    } else if (kind == ZN_DEV_HOST) {
        snprintf(c->dev_backend, sizeof c->dev_backend, "host-fn");
    }
    return 0;
}

void zn_comm_detach_device(zn_comm *c)
{
    if (!c || !c->dev)
        return;
    if (c->stream) {
        (void)zn_dev_stream_sync(c->dev, c->stream);
        zn_dev_stream_destroy(c->dev, c->stream);
        c->stream = NULL;
    }
#if ZN_HAVE_NCCL
    if (c->nccl)
        zn_nccl_destroy(c, !c->broken);
    c->nccl = NULL;
#endif
    c->dev = NULL;
    snprintf(c->dev_backend, sizeof c->dev_backend, "none");
}

void zn_comm_destroy(zn_comm *c)
{
    if (!c)
        return;
    int healthy = !c->broken;
    zn_comm_detach_device(c);
    if (c->worker_started) {
        pthread_mutex_lock(&c->lock);
        c->stop = 1;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->lock);
        pthread_join(c->worker, NULL);
    }
    healthy = healthy && !c->broken;
    if (c->ops && c->ops->destroy)
        c->ops->destroy(c, healthy);
    free(c->reports);
    free(c->dead);
    free(c->departed);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

int zn_comm_abort(zn_comm *c, int code)
{
    if (!c)
        return 0;
#if ZN_HAVE_NCCL
    if (c->nccl)
        zn_nccl_abort(c);
#endif
    return c->ops && c->ops->abort ? c->ops->abort(c, code) : 0;
}
