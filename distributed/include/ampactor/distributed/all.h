// ampactor::distributed, whole. Data parallel over c10d: RankGroup and the launcher's conventions.
#pragma once

#include <ampactor/distributed/dist.h>
