"""Graph neural networks on partitioned graphs (DistDGL, PyG distributed, CAGNET): each rank owns
a partition of the nodes and exchanges the features of halo (boundary) nodes with uneven counts."""
