#!/bin/sh
# Fails with a message on stderr and exit status 3.
echo "noise that scrolls away" >&2
echo "something broke: the disk is full" >&2
exit 3
