#!/usr/bin/python3
# Forks children that wait, until fork fails; prints how many it made.
import os, signal
n = 0
err = "none"
while n < 100000:
    try:
        pid = os.fork()
    except OSError as e:
        err = e.strerror
        break
    if pid == 0:
        signal.pause()
        os._exit(0)
    n += 1
print(n, err)
