"""fedjax_kd: federated distillation simulator in JAX/Flax."""
