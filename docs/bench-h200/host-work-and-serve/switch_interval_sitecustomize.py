import sys
sys.setswitchinterval(0.0005)   # experiment: the GIL's hand-off interval 0.5 ms instead of 5 ms
