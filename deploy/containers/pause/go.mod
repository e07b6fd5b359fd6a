// The pause process of the real node's pod sandboxes (deploy/containers/images.py: pause_image).
module tidepool.io/localenv/pause

go 1.26.0
