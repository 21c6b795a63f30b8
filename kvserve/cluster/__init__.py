"""`kvserve cluster`: kvserve replicas behind Ray Serve's HTTP proxy, routed by session and prefix.

The policy (`routing_keys`, `prefix_blocks`, `policy`) is plain Python, free of torch and Ray; the Ray
adapters (`ray_router`, `ingress`, `replica`, `application`) are thin shells around it and around the
FastAPI app of `kvserve serve`, driven in-process through `asgi_bridge`.
"""
