// The one header through which the tests reach kernel internals: the launch interface
// (FlexFwdLaunch / FlexBwdLaunch, workspace sizes, support checks) and, in CUDA builds, the
// workspace layouts and split-schedule headers the split tests read back from the device.
// When kernel files move or are renamed, only this header changes. (The API-level
// validation used to build geometries comes through test_util.h.)
#pragma once

#include "dispatch/family.h"
#include "dispatch/flex_launch.h"
#ifdef FLASHSPAN_WITH_CUDA
#include "dispatch/workspace.h"
#include "kernels/common/split_rule.h"
#include "kernels/sm90/launch_sm90.h"
#endif
