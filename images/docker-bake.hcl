# The fractional-gpu tag matrix: fractional-gpu:u<ubuntu>-cu<cuda>-<size>gb.
#
# Run from the repository root after scripts/build-release.sh:
#
#   docker buildx bake -f images/docker-bake.hcl                  # all 63 tags
#   docker buildx bake -f images/docker-bake.hcl u22-cu12-3-8gb   # one tag
#   docker buildx bake -f images/docker-bake.hcl --print          # what would be built
#   SIZE=10 docker buildx bake -f images/docker-bake.hcl custom   # fractional-gpu:u22-cu12.3-10gb
#   SIZE=6 UBUNTU=24.04 CUDA=12.8.1 TAG=u24-cu12.8-6gb docker buildx bake -f images/docker-bake.hcl custom
#
# Target names cannot hold dots: u22-cu12-3-8gb builds fractional-gpu:u22-cu12.3-8gb.
# Every variable can be set from the environment of the same name (IMAGE=registry/name,
# BASE_REPO=mirror/cuda, ...). images/bake.py reads this file for Docker engines
# without buildx (docs/images.md); keep attribute values to plain references and
# "${...}" interpolations of variables and matrix values so that it can.

variable "IMAGE" {
  default = "fractional-gpu"
}

# Where the CUDA base images come from: <BASE_REPO>:<cuda>-base-ubuntu<ubuntu>.
variable "BASE_REPO" {
  default = "nvidia/cuda"
}

# Build context: the output of scripts/build-release.sh, and the Dockerfile relative to it.
variable "DIST" {
  default = "target/dist"
}

variable "DOCKERFILE" {
  default = "../../images/Dockerfile"
}

variable "FGPU_VERSION" {
  default = "0.1.0"
}

variable "FGPU_SOURCE" {
  default = "https://github.com/fgpu/fgpu"
}

# Caps, in GiB.
variable "SIZES" {
  default = ["2", "4", "8", "12", "16", "24", "40"]
}

# Ubuntu and CUDA pairs for which NVIDIA publishes nvidia/cuda:<cuda>-base-ubuntu<ubuntu>
# (CUDA 11.8 and 12.3 have no Ubuntu 24.04 image, CUDA 13.0 has no Ubuntu 20.04 image).
variable "COMBOS" {
  default = [
    { name = "u20-cu11-8", tag = "u20-cu11.8", ubuntu = "20.04", cuda = "11.8.0" },
    { name = "u20-cu12-3", tag = "u20-cu12.3", ubuntu = "20.04", cuda = "12.3.2" },
    { name = "u20-cu12-8", tag = "u20-cu12.8", ubuntu = "20.04", cuda = "12.8.1" },
    { name = "u22-cu11-8", tag = "u22-cu11.8", ubuntu = "22.04", cuda = "11.8.0" },
    { name = "u22-cu12-3", tag = "u22-cu12.3", ubuntu = "22.04", cuda = "12.3.2" },
    { name = "u22-cu12-8", tag = "u22-cu12.8", ubuntu = "22.04", cuda = "12.8.1" },
    { name = "u22-cu13-0", tag = "u22-cu13.0", ubuntu = "22.04", cuda = "13.0.2" },
    { name = "u24-cu12-8", tag = "u24-cu12.8", ubuntu = "24.04", cuda = "12.8.1" },
    { name = "u24-cu13-0", tag = "u24-cu13.0", ubuntu = "24.04", cuda = "13.0.2" },
  ]
}

# Any size on demand: SIZE (GiB), UBUNTU, CUDA and TAG for the "custom" target.
variable "SIZE" {
  default = "8"
}

variable "UBUNTU" {
  default = "22.04"
}

variable "CUDA" {
  default = "12.3.2"
}

# The custom target's tag. Set it too when changing UBUNTU or CUDA.
variable "TAG" {
  default = "u22-cu12.3-${SIZE}gb"
}

group "default" {
  targets = ["fractional-gpu"]
}

target "fractional-gpu" {
  name       = "${combo.name}-${size}gb"
  matrix = {
    combo = COMBOS
    size  = SIZES
  }
  context    = DIST
  dockerfile = DOCKERFILE
  args = {
    UBUNTU_VERSION = combo.ubuntu
    CUDA_VERSION   = combo.cuda
    BASE_REPO      = BASE_REPO
    FGPU_LIMIT     = "${size}GiB"
    FGPU_VERSION   = FGPU_VERSION
    FGPU_SOURCE    = FGPU_SOURCE
  }
  tags = ["${IMAGE}:${combo.tag}-${size}gb"]
}

target "custom" {
  context    = DIST
  dockerfile = DOCKERFILE
  args = {
    UBUNTU_VERSION = UBUNTU
    CUDA_VERSION   = CUDA
    BASE_REPO      = BASE_REPO
    FGPU_LIMIT     = "${SIZE}GiB"
    FGPU_VERSION   = FGPU_VERSION
    FGPU_SOURCE    = FGPU_SOURCE
  }
  tags = ["${IMAGE}:${TAG}"]
}
