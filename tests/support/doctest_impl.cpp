// doctest's implementation, compiled once and without Torch (and without the
// tests' precompiled header, which already holds doctest's declarations).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
