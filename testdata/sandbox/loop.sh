#!/bin/sh
# Never ends.
while :; do :; done
