#!/bin/sh
# Writes 1 GiB to stdout.
exec head -c 1073741824 /dev/zero
