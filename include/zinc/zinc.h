/* zinc: the whole public API. Each subsystem has its own header. */
#ifndef ZINC_ZINC_H
#define ZINC_ZINC_H

#include "zinc/util.h"
#include "zinc/optim.h"
#include "zinc/config.h"
#include "zinc/topo.h"
#include "zinc/plan.h"
#include "zinc/device.h"
#include "zinc/model.h"
#include "zinc/generate.h"
#include "zinc/safetensors.h"
#include "zinc/tokens.h"
#include "zinc/comm.h"
#include "zinc/trace.h"
#include "zinc/train_model.h"
#include "zinc/train.h"
#include "zinc/ckpt.h"
#include "zinc/run.h"
#include "zinc/gensession.h"
#include "zinc/bench.h"
#include "zinc/launch.h"

#endif
