#!/bin/sh
# Reads $1/in.txt, appends a line to $1/out.txt, and writes in /tmp/$2.
set -e
cat "$1/in.txt"
echo "appended by $TOOLBATCH_CALL_ID" >>"$1/out.txt"
echo "tmp works" >"/tmp/$2"
cat "/tmp/$2"
