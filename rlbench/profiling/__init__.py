"""Profiling sessions: the reference trainer profiled (session.py), any command wrapped (wrap.py), rollout
servers observed (observe.py); py-spy (pyspy.py). The samplers they run are in rlbench/observe/."""
