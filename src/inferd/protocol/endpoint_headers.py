"""The headers of requests to endpoints (gRPC: metadata and trailing metadata of these names):
the one a client pins a variant with and the one every answer, error answers too, names its
variant in; and SageMaker's, which boto3's `TargetVariant` sends and its answers carry."""

TARGET_VARIANT_HEADER = "inferd-target-variant"
VARIANT_HEADER = "inferd-variant"
SAGEMAKER_TARGET_VARIANT_HEADER = "x-amzn-sagemaker-target-variant"
SAGEMAKER_INVOKED_VARIANT_HEADER = "x-amzn-invoked-production-variant"
