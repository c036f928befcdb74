"""Offline DPO on the run harness: the pair data, the jitted DPO step, the DPO plug-in and its plots."""
