"""The drop-in operators: ``matmul`` (numpy.matmul), ``conv2d``
(torch.nn.functional.conv2d), ``max_pool2d`` / ``avg_pool2d``."""
