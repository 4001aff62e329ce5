/* CCofferABI is headers only (include/coffer/); SwiftPM needs one source file for a C target. */
#include "coffer/coffer_wire.h"
