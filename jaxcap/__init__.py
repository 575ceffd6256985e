"""jaxcap: attention-based captioning and multimodal translation models in JAX/Flax."""

__version__ = "0.1.0"
