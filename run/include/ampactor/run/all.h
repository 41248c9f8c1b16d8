// ampactor::run, whole. A training run's checkpoints: save_run, load_run, resume_run.
#pragma once

#include <ampactor/run/run.h>
