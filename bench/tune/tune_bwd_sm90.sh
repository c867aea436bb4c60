#!/usr/bin/env bash
# The backward's variants of tune_sm90.sh (the name earlier results refer to):
#   bash bench/tune/tune_bwd_sm90.sh [variant...]
exec bash "$(dirname "$0")/tune_sm90.sh" bwd "$@"
