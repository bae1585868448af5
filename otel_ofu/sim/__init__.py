"""The simulated fleet (:mod:`.fleet`): GPUs, jobs and scenarios with known ground truth, the
embedded default that shows the whole pipeline working without a GPU.
"""
