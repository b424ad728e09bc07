"""Planning: pure functions from (topology, profile, shape) to plan data.

``split_cost`` decides whether slower clusters join a job, ``gemm`` holds the partition plan
and the default planner, ``costmodel`` AsyMo's block-size cost model, ``matmul`` the calibrated
planner. Plans are plain data computed once per shape and cached.
"""
