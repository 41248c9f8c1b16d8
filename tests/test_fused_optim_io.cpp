#include "fused_fixture.h"
