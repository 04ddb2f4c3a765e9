/* Private declarations shared by the files of src/model/. */
#ifndef ZN_MODEL_IMPL_H
#define ZN_MODEL_IMPL_H

#include "zinc/model.h"

#endif
