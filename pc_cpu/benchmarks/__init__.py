"""The paper's measurements on this machine: accuracy (Table 1), latency (Figs 3-5, Table 2), peers.

`pc-cpu bench` runs them (pc_cpu.benchmarks.command); results land in bench/RESULTS.md.
"""
