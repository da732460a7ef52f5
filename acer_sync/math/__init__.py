"""The pure math of ACER: the losses and Retrace (time-major functions of tensors), the RMSProp of
TF1/Baselines, the learning-rate schedules. Imports nothing of the project, no env, no I/O."""
