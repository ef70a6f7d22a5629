"""Clusters: the GPU catalogue, the Cluster table, spec files, presets from the papers, random generators."""

from tag.cluster.build import INTRA_LATENCY_S, NETWORK_LATENCY_S, Link, Machine, build_cluster
from tag.cluster.cluster import CLUSTER_FORMAT, CLUSTER_VERSION, Cluster, widest_paths
from tag.cluster.generators import (
    TAG_RANDOM_GPUS,
    as_rng,
    grid_cluster,
    hop_bandwidth,
    random_blk_1,
    random_blk_2,
    random_node_sizes,
    tag_random,
    uniform_dist,
)
from tag.cluster.gpus import DTYPES, GPU_TYPES, GPUType, gpu_type
from tag.cluster.presets import (
    DGX1_NVLINK_DOUBLE,
    DGX1_NVLINK_SINGLE,
    PRESETS,
    PresetInfo,
    dgx1x4,
    list_presets,
    resolve_cluster,
    tag_cloud,
    tag_testbed,
    two_level,
)
from tag.cluster.spec import SPEC_SUFFIXES, load_cluster, parse_cluster_spec

__all__ = [
    # GPU catalogue
    "GPUType", "GPU_TYPES", "DTYPES", "gpu_type",
    # the cluster table
    "Cluster", "CLUSTER_FORMAT", "CLUSTER_VERSION", "widest_paths",
    # building from machines and links
    "Machine", "Link", "build_cluster", "INTRA_LATENCY_S", "NETWORK_LATENCY_S",
    # spec files and addresses
    "load_cluster", "parse_cluster_spec", "resolve_cluster", "SPEC_SUFFIXES",
    # presets
    "PRESETS", "PresetInfo", "list_presets", "tag_testbed", "tag_cloud", "two_level", "dgx1x4",
    "DGX1_NVLINK_SINGLE", "DGX1_NVLINK_DOUBLE",
    # generators
    "as_rng", "grid_cluster", "hop_bandwidth", "random_blk_1", "random_blk_2", "uniform_dist", "tag_random",
    "random_node_sizes", "TAG_RANDOM_GPUS",
]
