#!/usr/bin/env bash
# NOTE: runs against the tree of commit 28fac21 only (`git checkout 28fac21`), as
# tune_sm90.sh does: the PSA_FA2_BWD90_* macros it varies are gone from the current tree
# (bench/tune/README.md lists what runs there).
# The backward's variants of tune_sm90.sh (the name earlier results refer to):
#   bash bench/tune/tune_bwd_sm90.sh [variant...]
exec bash "$(dirname "$0")/tune_sm90.sh" bwd "$@"
