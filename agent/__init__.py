"""The node agent: measures GPU memory (NVML or simulated), publishes a
GPUNodeReport for its node, and guards declared memory at run time."""
