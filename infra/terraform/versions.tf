terraform {
  # terraform_data needs 1.4; the configuration is checked with 1.5.7 (make tf-fmt).
  required_version = ">= 1.5.0"

  # State in GCS: terraform init -backend-config="bucket=<bucket>" -backend-config="prefix=relaybus"
  backend "gcs" {}

  required_providers {
    # Pinned: a provider upgrade is a reviewed change (bump it here and re-run
    # `terraform init -upgrade`), never a side effect of a fresh checkout.
    google = {
      source  = "hashicorp/google"
      version = "= 6.14.1"
    }
  }
}

provider "google" {
  project = var.project_id
  region  = var.region

  default_labels = {
    app = "relaybus"
  }
}
