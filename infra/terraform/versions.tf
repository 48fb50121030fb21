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
    # Only for google_project_service_identity, which exists in the beta
    # provider only ("These resources are in beta, and should be used with
    # the terraform-provider-google-beta provider":
    # https://registry.terraform.io/providers/hashicorp/google/6.14.1/docs/resources/project_service_identity).
    google-beta = {
      source  = "hashicorp/google-beta"
      version = "= 6.14.1"
    }
    # time_sleep: waits for IAM grants and log-based metrics to propagate
    # (https://registry.terraform.io/providers/hashicorp/time/0.12.1/docs/resources/sleep).
    time = {
      source  = "hashicorp/time"
      version = "= 0.12.1"
    }
    # random_password: the Cloud SQL users' passwords (database.tf).
    random = {
      source  = "hashicorp/random"
      version = "= 3.6.3"
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

provider "google-beta" {
  project = var.project_id
  region  = var.region

  default_labels = {
    app = "relaybus"
  }
}
