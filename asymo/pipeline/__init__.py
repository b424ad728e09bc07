"""Layer-level CNN pipelines on heterogeneous CPUs (Pipe-it and its successors).

Modules, one concept each:

- ``configs``: core configurations ``(cluster, count)`` of a stage.
- ``table``: the time matrix ``T`` (per-layer time on each core configuration).
- ``timemodel``: Pipe-it's per-layer time prediction (Eq. 5 regression, Eq. 6-8 multi-core).
- ``dse``: Pipe-it's design space (Eq. 1-2) and Algorithms 1-3.
- ``optimal``: exact optimal contiguous partition (dynamic programming).
- ``two_stage``: paper 004's O(N) two-stage split with transfer cost, objectives, Pareto set.
- ``tuning``: Pipe-search (paper 002) and dynamic re-partitioning (paper 004 Algorithm 2).
- ``plan``: model + machine -> ``PipelinePlan``.
- ``runtime``: the pipeline runtime and the kernel-level / parallel-frames baselines.
- ``calibrate``: micro-benchmarks and layer measurements that feed the time model.
"""
from asymo.pipeline.configs import CoreConfig, core_configs, stage_cpus
from asymo.pipeline.dse import design_points, find_split, merge_stage, pipeline_count, work_flow
from asymo.pipeline.optimal import optimal_partition, optimal_pipeline
from asymo.pipeline.plan import PipelinePlan, plan_pipeline
from asymo.pipeline.runtime import KernelLevel, ParallelFrames, Pipeline, RunStats
from asymo.pipeline.table import LayerTimes
from asymo.pipeline.timemodel import GemmTimeRegressor, LayerTimeModel, MultiCoreModel
from asymo.pipeline.tuning import (DynamicTwoStage, generate_configurations, pipe_search)
from asymo.pipeline.two_stage import best_two_stage, pareto_set, two_stage_partition

__all__ = ["CoreConfig", "core_configs", "stage_cpus", "design_points", "find_split",
           "merge_stage", "pipeline_count", "work_flow", "optimal_partition",
           "optimal_pipeline", "PipelinePlan", "plan_pipeline", "KernelLevel",
           "ParallelFrames", "Pipeline", "RunStats", "LayerTimes", "GemmTimeRegressor",
           "LayerTimeModel", "MultiCoreModel", "DynamicTwoStage", "generate_configurations",
           "pipe_search", "best_two_stage", "pareto_set", "two_stage_partition"]
