"""kcollect: benchmark Triton kernels against their baselines, store the results, publish a site."""
