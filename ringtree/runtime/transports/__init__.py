"""How bytes move: the array backends (backend; cuda), CUDA IPC between the GPU ranks of a node (ipc),
which transport carries a call's messages to each peer (choice), and the pacing of sends to ranks on
other nodes (remote_sends). Imports no other room of the runtime."""
