"""How hosts are reached: SSH targets, connections (paramiko or local processes), and steps on all hosts at once."""
