#!/bin/sh
# Reads $1/in.txt and tries to write into $1.
cat "$1/in.txt"
if (echo x >"$1/written.txt") 2>/dev/null; then echo "write ok"; else echo "write failed"; fi
