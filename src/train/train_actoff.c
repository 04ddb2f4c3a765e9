/* Activation checkpoints in pinned RAM (activation_checkpointing.
 * cpu_checkpointing): the layers' inputs saved D2H after each forward,
 * loaded back one group ahead of the backward. Not to be confused with
 * training checkpoints (src/ckpt/). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train-impl.h"
#include "util/try-impl.h"
#include "zn_build_config.h"

/* ---- cpu checkpointing (activation_checkpointing.cpu_checkpointing) ------
 * Group inputs live in pinned RAM; the device holds ZN_CK_RING of them.
 * Ordinal k (tr->act.ordinal) uses slot k % ZN_CK_RING: the forward writes input
 * k + 1 while it reads k, and saves each one D2H on act.stream as soon as it is
 * written; the backward of a group loads the previous group's input H2D on
 * act.stream while it runs. An input still in its slot (the last forward's, the
 * head's neighbours) is not loaded again. The copies share the link: their
 * spans go on the H2D / D2H tracks beside the parameters' and gradients'. */

static int ck_slot(const zn_trainer *tr, int b)
{
    return tr->act.ordinal[b] % ZN_CK_RING;
}

/* Before a forward writes block b's input (b a group's first block). */
int zn_tr_ck_before_write(zn_trainer *tr, int b)
{
    if (!tr->act.on || b <= 0 || b >= tr->L)
        return 0;
    int s = ck_slot(tr, b);
    if (tr->act.saving[s]) {   /* the slot's last save has left it */
        ZN_TRY(zn_dev_stream_wait_event(tr->dev, tr->s_comp, tr->act.ev_saved[s]));
        tr->act.saving[s] = false;
    }
    if (tr->act.loading[s]) {  /* an unused load (a failed step) has landed */
        ZN_TRY(zn_dev_stream_wait_event(tr->dev, tr->s_comp, tr->act.ev_loaded[s]));
        tr->act.loading[s] = false;
    }
    tr->act.res[s] = b;
    return 0;
}

/* After the forward wrote block b's input: its copy to pinned RAM. */
int zn_tr_ck_save(zn_trainer *tr, int b)
{
    if (!tr->act.on || b <= 0 || b >= tr->L)
        return 0;
    int s = ck_slot(tr, b);
    ZN_TRY(zn_dev_event_record(tr->dev, tr->act.ev_written[s], tr->s_comp));
    ZN_TRY(zn_dev_stream_wait_event(tr->dev, tr->act.stream, tr->act.ev_written[s]));
    char name[ZN_TRACE_NAME_LEN];
    snprintf(name, sizeof name, "ckpt d2h b%d", b);
    zn_mark *mk = zn_train_mark_begin(tr, tr->act.stream, ZN_RES_D2H, name);
    ZN_TRY(zn_dev_copy_d2h(tr->dev, tr->act.stream, tr->act.host[b], tr->act.ring[s], tr->act.bytes));
    zn_train_mark_end(tr, tr->act.stream, mk);
    ZN_TRY(zn_dev_event_record(tr->dev, tr->act.ev_saved[s], tr->act.stream));
    tr->act.saving[s] = true;
    atomic_fetch_add(&tr->tm.d2h, tr->act.bytes);
    return 0;
}

/* Block b's input back into its slot unless the slot still holds it. The
 * slot's occupant may be read by anything the compute stream has queued. */
static int ck_load(zn_trainer *tr, int b)
{
    if (!tr->act.on || b <= 0)
        return 0;
    int s = ck_slot(tr, b);
    if (tr->act.res[s] == b)
        return 0;
    ZN_TRY(zn_dev_event_record(tr->dev, tr->act.ev_compute, tr->s_comp));
    ZN_TRY(zn_dev_stream_wait_event(tr->dev, tr->act.stream, tr->act.ev_compute));
    char name[ZN_TRACE_NAME_LEN];
    snprintf(name, sizeof name, "ckpt h2d b%d", b);
    zn_mark *mk = zn_train_mark_begin(tr, tr->act.stream, ZN_RES_H2D, name);
    ZN_TRY(zn_dev_copy_h2d(tr->dev, tr->act.stream, tr->act.ring[s], tr->act.host[b], tr->act.bytes));
    zn_train_mark_end(tr, tr->act.stream, mk);
    ZN_TRY(zn_dev_event_record(tr->dev, tr->act.ev_loaded[s], tr->act.stream));
    tr->act.loading[s] = true;
    tr->act.res[s] = b;
    atomic_fetch_add(&tr->tm.h2d, tr->act.bytes);
    return 0;
}

/* Entering the backward of the group of block b (at its last block): its
 * input on the device, and the previous group's loading behind it. */
int zn_tr_ck_enter_backward(zn_trainer *tr, const zn_block *bl)
{
    if (!tr->act.on || bl->gfirst <= 0)
        return 0;
    int s = ck_slot(tr, bl->gfirst);
    ZN_TRY(ck_load(tr, bl->gfirst));
    if (tr->act.loading[s]) {
        ZN_TRY(zn_dev_stream_wait_event(tr->dev, tr->s_comp, tr->act.ev_loaded[s]));
        tr->act.loading[s] = false;
    }
    int prev = tr->blocks[bl->gfirst - 1].gfirst;
    return prev > 0 ? ck_load(tr, prev) : 0;
}
#undef CK
