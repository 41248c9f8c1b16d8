// ampactor::messages, whole. The protocol's CAF type ids and registry.
#pragma once

#include <ampactor/messages/config.h>
#include <ampactor/messages/messages.h>
#include <ampactor/messages/registry.h>
