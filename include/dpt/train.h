// Training, all of it: the configuration, the optimizer and its schedule, the sampler, the metrics
// and run_training. Each lives in its own header; this one includes them for callers that use
// several.
#pragma once

#include "dpt/config.h"
#include "dpt/metrics.h"
#include "dpt/nn.h"  // the models a training runs
#include "dpt/optimizer.h"
#include "dpt/run.h"
#include "dpt/sampler.h"
