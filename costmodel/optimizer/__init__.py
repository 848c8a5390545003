"""Optimizer models: element-wise (AdamW) and layer-wise (Muon) distributed optimizers."""
