"""Tensor parallelism for the target model: process groups, worker processes, their step loop."""
