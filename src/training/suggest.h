#pragma once
// Moved to core so the data layer can suggest flags too; kept so existing includes still work.
#include "core/suggest.h"
