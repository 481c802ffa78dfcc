#!/usr/bin/python3
# Burns CPU for ever (for the CPU time limit).
while True:
    pass
