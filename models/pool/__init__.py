"""The super cluster pool's pure logic: quota slices, namespace placement, pod placement (seed 002)."""
